"""The entry point of the training code: task name -> batched EncDec features."""

import difflib
import numbers

import seqio

from keras_moe.log_filters import harmless_log_messages_dropped


def _check_lengths(sequence_length):
    if not isinstance(sequence_length, dict) or set(sequence_length) != {"inputs", "targets"}:
        raise ValueError(
            'sequence_length must be a dict with keys "inputs" and '
            f'"targets", got {sequence_length!r}'
        )
    for key, value in sequence_length.items():
        if not isinstance(value, numbers.Integral) or value < 1:
            raise ValueError(f"sequence_length[{key!r}] must be a positive int, got {value!r}")


def get_task_or_mixture(name):
    """The registered seqio Task or Mixture; a ValueError suggests close names.

    Example:
      >>> get_task_or_mixture("embedded_x2en").name
      'embedded_x2en'
    """
    names = set(seqio.TaskRegistry.names()) | set(seqio.MixtureRegistry.names())
    if name not in names:
        close = difflib.get_close_matches(str(name), sorted(names), n=5)
        raise ValueError(
            f"name {name!r} is not a registered task or mixture "
            f"(did you `from keras_moe import tasks`?); close names: {close}"
        )
    return seqio.get_mixture_or_task(name)


def get_dataset(
    name,
    sequence_length,
    split="train",
    batch_size=8,
    shuffle=True,
    seed=None,
    pack=True,
    num_epochs=1,
    use_cached=False,
    shard_info=None,
):
    """Batched encoder-decoder features of a registered task or mixture.

    Runs `seqio.get_dataset` with `seqio.EncDecFeatureConverter(pack=pack)` and
    batches with `drop_remainder=True`.

    Args:
      name: task or mixture name, e.g. "embedded_span_corruption" or
        "bible_x2en_byte".
      sequence_length: {"inputs": int, "targets": int} (task feature lengths).
        For span corruption targets must be at least
        `tasks.span_corruption_targets_length(inputs)`.
      split: "train", "validation" or "test" (the ones the source has).
      batch_size: examples per batch (after packing), > 0.
      shuffle: shuffle files and examples.
      seed: seed of the shuffles and of the random preprocessors (span
        choice); the same seed gives the same batches.
      pack: pack several examples per row (adds *_segment_ids and
        *_positions).
      num_epochs: passes over the data; None repeats forever.
      use_cached: read a seqio cache instead of preprocessing.
      shard_info: optional `seqio.ShardInfo` for multi-host input.

    Returns:
      A `tf.data.Dataset` of dicts with `encoder_input_tokens`,
      `decoder_input_tokens`, `decoder_target_tokens`, `decoder_loss_weights`
      (and `encoder_segment_ids`, `encoder_positions`, `decoder_segment_ids`,
      `decoder_positions` when packed), each [batch_size, length] int32.

    Example:
      >>> from keras_moe import tasks
      >>> ds = tasks.get_dataset("embedded_span_corruption_byte",
      ...                        {"inputs": 128, "targets": 32}, batch_size=2,
      ...                        seed=0)
      >>> sorted(next(iter(ds)))[:2]
      ['decoder_input_tokens', 'decoder_loss_weights']
    """
    _check_lengths(sequence_length)
    if not isinstance(batch_size, numbers.Integral) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")
    task = get_task_or_mixture(name)
    with harmless_log_messages_dropped():
        return seqio.get_dataset(
            task,
            task_feature_lengths=dict(sequence_length),
            feature_converter=seqio.EncDecFeatureConverter(pack=pack),
            dataset_split=split,
            use_cached=use_cached,
            shuffle=shuffle,
            num_epochs=num_epochs,
            shard_info=shard_info,
            seed=seed,
            batch_size=int(batch_size),
            verbose=False,
        )
