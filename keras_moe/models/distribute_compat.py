"""Works around two Keras 3.15 problems of `fit`/`evaluate` under `tf.distribute`.

1. Before `fit`/`evaluate`, Keras' TF trainer (`_maybe_symbolic_build`) takes
   one batch from the distributed dataset's iterator, only to learn shapes and
   dtypes, then restarts the iterator. Training therefore reads the dataset a
   second time, and a seeded pipeline that reshuffles on each pass (seqio's
   shuffle does) trains on different examples than on one device: a 2-worker
   run saw other batches than the 1-worker run of the same seed. It then
   reduces that batch with `strategy.reduce("MEAN", batch, axis=None)`, which
   `MultiWorkerMirroredStrategy` refuses for a nest ("Attempt to convert a
   value ({... PerReplica}) with an unsupported type (dict) to a Tensor").
   The mixin builds from the dataset's element spec instead: no batch is read,
   nothing is reduced.
2. Keras' `reduce_per_replica` fails on scalar logs under multi-worker
   `MultiWorkerMirroredStrategy` (see `_vectorize_logs`).
"""

import keras
from keras import ops, tree


def _local_batch(strategy, batch):
    import tensorflow as tf

    def local(value):
        if isinstance(value, tf.distribute.DistributedValues):
            return strategy.experimental_local_results(value)[0]
        return value

    return tree.map_structure(local, batch)


def _symbolic_batch(epoch_iterator):
    """KerasTensors shaped like one batch of the iterator's dataset (batch axis None),
    or None when its element spec is not a plain nest of `tf.TensorSpec`."""
    import tensorflow as tf

    adapter = getattr(epoch_iterator, "data_adapter", None)
    get_dataset = getattr(adapter, "get_tf_dataset", None)
    if get_dataset is None:
        return None
    spec = getattr(get_dataset(), "element_spec", None)
    specs = tf.nest.flatten(spec) if spec is not None else []
    if not specs or not all(type(s) is tf.TensorSpec and s.shape.rank for s in specs):
        return None
    return tf.nest.map_structure(
        lambda s: keras.KerasTensor((None,) + tuple(s.shape[1:]), s.dtype.name), spec
    )


class _BuildMixin:
    def _maybe_symbolic_build(self, iterator=None, data_batch=None):
        strategy = getattr(self, "_distribute_strategy", None)
        if iterator is not None and data_batch is None and strategy is not None:
            data_batch = _symbolic_batch(iterator)
            if data_batch is None:  # A spec it cannot describe: peek, as Keras does.
                for _, _, it in iterator:
                    data_batch = _local_batch(strategy, next(it))
                    break
            iterator = None
        return super()._maybe_symbolic_build(iterator=iterator, data_batch=data_batch)


def _multi_worker(strategy):
    import tensorflow as tf

    return (
        isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy)
        and strategy.extended._in_multi_worker_mode()
    )


def _vectorize_logs(model, logs):
    """Scalar logs -> shape [1] under a multi-worker strategy.

    Keras 3.15's `reduce_per_replica` reduces each log under a multi-worker
    `MultiWorkerMirroredStrategy` with `strategy.reduce("MEAN", v, axis=0)`,
    which fails on the scalar metric results ("Invalid reduction dimension 0
    for input with 0 dimensions"). With a leading axis of 1 the same reduce
    returns the scalar mean over all replicas, as "mean" does on one worker.
    """
    strategy = getattr(model, "_distribute_strategy", None)
    if strategy is None or not _multi_worker(strategy):
        return logs

    def expand(value):
        if hasattr(value, "shape") and len(value.shape) == 0:
            return ops.reshape(value, (1,))
        return value

    return tree.map_structure(expand, logs)


class DistributedStepMixin:
    """`keras.Model` mixin: `train_step`/`test_step` logs that reduce under multi-worker."""

    def train_step(self, *args, **kwargs):
        return _vectorize_logs(self, super().train_step(*args, **kwargs))

    def test_step(self, *args, **kwargs):
        return _vectorize_logs(self, super().test_step(*args, **kwargs))


class DistributedBuildMixin(DistributedStepMixin, _BuildMixin):
    """`keras.Model` mixin: under `tf.distribute`, `fit`/`evaluate` read the data as on one device
    and work with `MultiWorkerMirroredStrategy`.

    Both Keras 3.15 problems above. Without a strategy (and on other backends,
    which never call these methods through tf.distribute) it changes nothing.
    """
