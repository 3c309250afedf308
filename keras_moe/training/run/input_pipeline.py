"""seqio task/mixture -> a repeated `tf.data` stream of Keras `(x, y, sample_weight)`."""

import hashlib

import numpy as np

from keras_moe.models import seqio_to_keras
from keras_moe.training.errors import TrainingConfigError
from keras_moe.validation import is_int


class EmptyDatasetError(TrainingConfigError):
    """The requested task/split produced no batch."""


def check_feature_lengths(feature_lengths):
    if not isinstance(feature_lengths, dict) or set(feature_lengths) != {"inputs", "targets"}:
        raise TrainingConfigError(
            'TASK_FEATURE_LENGTHS must be a dict {"inputs": int, "targets": int}, '
            f"got {feature_lengths!r}."
        )
    for key, value in feature_lengths.items():
        if not is_int(value) or value < 1:
            raise TrainingConfigError(
                f"TASK_FEATURE_LENGTHS[{key!r}] must be a positive integer, got {value!r}."
            )


def get_task(name):
    """The seqio task or mixture `name` (registered by `from keras_moe import tasks`);
    clear error if unknown."""
    from keras_moe import tasks  # noqa: F401  (registers the tasks)
    from keras_moe.tasks import pipeline

    if not isinstance(name, str) or not name:
        raise TrainingConfigError(f"MIXTURE_OR_TASK_NAME must be a non-empty string, got {name!r}.")
    try:
        return pipeline.get_task_or_mixture(name)
    except ValueError as e:
        raise TrainingConfigError(f"unknown task or mixture: {e}") from None


def check_data(name: str) -> None:
    """Raises `TrainingConfigError` naming the install command when task or
    mixture `name` has a registered data check that fails (quick: no data read).

    Args:
        name: a registered task or mixture name.

    Example:
    >>> check_data("embedded_span_corruption")  # the embedded corpus is always here
    """
    from keras_moe.tasks import SourceMissingError, registry

    try:
        registry.check_sources(name)
    except SourceMissingError as e:
        raise TrainingConfigError(f"data of task {name!r} is missing: {e}") from None


def make_dataset(
    task,
    feature_lengths,
    split="train",
    batch_size=8,
    pack=True,
    shuffle=True,
    seed=0,
    repeat=True,
    skip_batches=0,
    shard_info=None,
):
    """Batched Keras inputs of a seqio task: `(inputs_dict, targets, loss_weights)`.

    The stream is deterministic given `seed` and TensorFlow's global seed
    (seqio seeds its shuffles and random preprocessors with `seed`, and TF
    combines an op's seed with the global one; the trainer sets both), so
    `skip_batches` reproduces the data position of a resumed run exactly.

    Args:
        task: registered task or mixture name.
        feature_lengths: {"inputs": int, "targets": int}.
        split: dataset split.
        batch_size: global batch size.
        pack: seqio packing.
        shuffle: shuffle (seeded).
        seed: seed of shuffles and preprocessors.
        repeat: repeat forever (training) or one pass (eval).
        skip_batches: batches to skip at the start (resume).
        shard_info: optional `seqio.ShardInfo` (multi-host input).

    Returns:
        a `tf.data.Dataset`.
    """
    import tensorflow as tf

    from keras_moe import tasks

    check_feature_lengths(feature_lengths)
    if not is_int(batch_size) or batch_size < 1:
        raise TrainingConfigError(f"BATCH_SIZE must be a positive integer, got {batch_size!r}.")
    get_task(task)
    try:
        ds = tasks.get_dataset(
            task,
            dict(feature_lengths),
            split=split,
            batch_size=batch_size,
            shuffle=shuffle,
            seed=seed,
            pack=pack,
            num_epochs=None if repeat else 1,
            shard_info=shard_info,
        )
    except tasks.SourceMissingError as e:
        raise TrainingConfigError(f"data of task {task!r} is missing: {e}") from None
    except ValueError as e:
        raise TrainingConfigError(f"cannot build dataset {task!r} split {split!r}: {e}") from None
    ds = ds.map(seqio_to_keras, num_parallel_calls=tf.data.AUTOTUNE)
    if skip_batches:
        ds = ds.skip(int(skip_batches))
    return ds.prefetch(tf.data.AUTOTUNE)


def make_process_dataset(task, feature_lengths, split, plan, **kwargs):
    """This process's rows of every global batch, read from its seqio shards.

    Args:
        task, feature_lengths, split: as for `make_dataset`.
        plan: `(shard indices, input shards, rows per shard)` from
            `multihost.input_plan`. With one shard this is `make_dataset`
            unsharded; otherwise each shard's batch of `rows per shard` is read
            with `seqio.ShardInfo` and the shards' batches are concatenated in
            shard order.
        **kwargs: the other `make_dataset` arguments (pack, shuffle, seed,
            repeat, skip_batches), applied to every shard.

    Example:
    >>> plan = ([0, 1], 2, 2)  # one process reading both shards of a 4-row batch
    >>> ds = make_process_dataset("embedded_span_corruption", {"inputs": 32, "targets": 8},
    ...                           "train", plan)
    >>> inputs, targets, weights = next(iter(ds))
    >>> tuple(targets.shape)
    (4, 8)
    """
    import seqio
    import tensorflow as tf

    indices, num_shards, rows = plan
    if num_shards == 1:
        return make_dataset(task, feature_lengths, split, rows, **kwargs)
    shards = [
        make_dataset(
            task,
            feature_lengths,
            split,
            rows,
            shard_info=seqio.ShardInfo(index=i, num_shards=num_shards),
            **kwargs,
        )
        for i in indices
    ]
    if len(shards) == 1:
        return shards[0]
    return tf.data.Dataset.zip(tuple(shards)).map(
        lambda *batches: tf.nest.map_structure(lambda *parts: tf.concat(parts, 0), *batches)
    )


def check_not_empty(ds, task, split):
    """Raises `EmptyDatasetError` when `ds` yields no batch; returns the first batch."""
    for batch in ds.take(1):
        return batch
    raise EmptyDatasetError(
        f"task {task!r} split {split!r} produced no batch of the requested size "
        "(empty split, or fewer examples than BATCH_SIZE)."
    )


def finite(ds):
    """`ds` (finite) cached, with its cardinality asserted.

    Keras 3.15's `evaluate` on a finite dataset of unknown cardinality (what
    seqio returns) runs one extra, empty step and averages a 0 into `loss`
    (5 batches: loss x 5/6); a known cardinality avoids that.
    """
    import tensorflow as tf

    ds = ds.cache()
    count = sum(1 for _ in ds)
    return ds.apply(tf.data.experimental.assert_cardinality(count))


def batch_fingerprint(tokens):
    """Short stable hash of a batch's `encoder_input_tokens` (numpy or tensor)."""

    array = np.ascontiguousarray(np.asarray(tokens), dtype=np.int32)
    return hashlib.sha1(array.tobytes()).hexdigest()[:16]


def record_batches(ds, path):
    """`ds` that appends each consumed batch's fingerprint to the text file `path`.

    The hook is the last op of the pipeline (after prefetch), so a line is
    written when the training loop takes the batch, not when tf.data reads it
    ahead: the file is the exact sequence of batches the optimizer saw (plus
    at most the one in flight when a process is killed).
    """
    import tensorflow as tf

    def write(tokens):
        with open(path, "a", encoding="utf-8") as f:
            f.write(batch_fingerprint(tokens.numpy()) + "\n")
            f.flush()
        return tf.constant(0, tf.int32)

    def hook(x, *rest):
        done = tf.py_function(write, [x["encoder_input_tokens"]], tf.int32)
        with tf.control_dependencies([done]):
            x = dict(x)
            x["encoder_input_tokens"] = tf.identity(x["encoder_input_tokens"])
        return (x,) + tuple(rest)

    ds = ds.map(hook)
    options = tf.data.Options()
    # tf.data would otherwise add a prefetch after the hook (read-ahead).
    options.experimental_optimization.inject_prefetch = False
    return ds.with_options(options)
