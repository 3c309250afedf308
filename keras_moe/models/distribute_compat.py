"""Works around Keras 3.15's first-batch peek under multi-worker strategies.

Before `fit`/`evaluate`, Keras' TF trainer (`_maybe_symbolic_build`) takes one
batch of the distributed dataset and calls `strategy.reduce("MEAN", batch,
axis=None)` on the whole (nested) batch, only to learn its shapes and dtypes.
`MultiWorkerMirroredStrategy.reduce` does not accept a nest (a dict of
`PerReplica` values) and fails with "Attempt to convert a value ({...
PerReplica}) with an unsupported type (dict) to a Tensor"; it would also
all-reduce integer token ids for nothing. The mixin below replaces the reduce
by the first local replica's values: the same shapes (per replica) and dtypes,
no collective, any strategy.
"""


def _local_batch(strategy, batch):
    import tensorflow as tf
    from keras import tree

    def local(value):
        if isinstance(value, tf.distribute.DistributedValues):
            return strategy.experimental_local_results(value)[0]
        return value

    return tree.map_structure(local, batch)


class _BuildMixin:

    def _maybe_symbolic_build(self, iterator=None, data_batch=None):
        strategy = getattr(self, "_distribute_strategy", None)
        if iterator is not None and data_batch is None and strategy is not None:
            for _, _, it in iterator:
                data_batch = _local_batch(strategy, next(it))
                break
            iterator = None
        return super()._maybe_symbolic_build(iterator=iterator, data_batch=data_batch)


def _multi_worker(strategy):
    import tensorflow as tf

    return (isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy)
            and strategy.extended._in_multi_worker_mode())  # noqa: SLF001


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
    from keras import ops, tree

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
    """`keras.Model` mixin making `fit`/`evaluate` work under `MultiWorkerMirroredStrategy`.

    Both Keras 3.15 problems above; a no-op with one worker, Mirrored, TPU
    or the default strategy (and on other backends, which never call these
    methods through tf.distribute).
    """
