"""Registration helpers: one task (or mixture) per vocabulary kind."""

import seqio

from keras_moe.tasks import vocab as vocab_lib

# Task name -> a cheap check that its data is here (raises SourceMissingError).
_SOURCE_CHECKS = {}


def register_task(
    base_name,
    source,
    preprocessors,
    *,
    metric_fns=(),
    postprocess_fn=None,
    kinds=vocab_lib.VOCAB_KINDS,
    shuffle_buffer_size=1000,
):
    """Registers `base_name` (SentencePiece) and `base_name + "_byte"`.

    An existing task of the same name is replaced, so reloading a module is
    harmless.  Nothing here touches the data: registration never fails because
    a source is missing.

    Args:
      base_name: task name for the default vocabulary.
      source: a `seqio.DataSource`.
      preprocessors: the task's preprocessor list (same for every vocabulary).
      metric_fns: seqio metric functions.
      postprocess_fn: seqio postprocess function.
      kinds: vocabulary kinds to register.
      shuffle_buffer_size: seqio's example shuffle buffer.

    Returns:
      The list of registered names.

    Example:
      >>> register_task("my_task", source, [seqio.preprocessors.tokenize])
      ['my_task', 'my_task_byte']
    """
    return _replace_per_kind(
        seqio.TaskRegistry,
        base_name,
        kinds,
        lambda name, kind: dict(
            source=source,
            preprocessors=list(preprocessors),
            output_features=vocab_lib.output_features(kind),
            metric_fns=list(metric_fns),
            postprocess_fn=postprocess_fn,
            shuffle_buffer_size=shuffle_buffer_size,
        ),
    )


def _replace_per_kind(registry, base_name, kinds, arguments):
    """Adds `base_name`'s entry of each vocabulary kind to `registry` (replacing an
    existing one) with `registry.add(name, **arguments(name, kind))`; returns the names."""
    names = []
    for kind in kinds:
        name = vocab_lib.task_name(base_name, kind)
        if name in registry.names():
            registry.remove(name)
        registry.add(name, **arguments(name, kind))
        names.append(name)
    return names


def register_source_check(base_name, check, *, kinds=vocab_lib.VOCAB_KINDS):
    """Registers `check()` as the data check of `base_name`'s tasks (every kind).

    Args:
      base_name: the task name for the default vocabulary.
      check: a zero-argument callable that raises `SourceMissingError` when
        the task's data is not here; it must be quick (no data read).
      kinds: vocabulary kinds to register it for.
    """
    for kind in kinds:
        _SOURCE_CHECKS[vocab_lib.task_name(base_name, kind)] = check


def check_sources(name: str) -> None:
    """Runs the data checks of task `name`, or of every task of mixture `name`.

    Tasks without a registered check pass; their missing data shows when read.

    Args:
      name: a registered task or mixture name.

    Example:
      >>> check_sources("embedded_span_corruption")  # embedded: always here
    """
    if name in seqio.MixtureRegistry.names():
        names = [task.name for task in seqio.get_subtasks(seqio.get_mixture_or_task(name))]
    else:
        names = [name]
    for task_name in names:
        if task_name in _SOURCE_CHECKS:
            _SOURCE_CHECKS[task_name]()


def register_mixture(base_name, base_tasks_and_rates, *, kinds=vocab_lib.VOCAB_KINDS):
    """Registers a mixture per vocabulary kind over the matching tasks.

    Args:
      base_name: mixture name for the default vocabulary.
      base_tasks_and_rates: list of (base task name, rate) where rate is a
        float or a callable `rate(task) -> float` (evaluated lazily by seqio).
      kinds: vocabulary kinds to register.

    Returns:
      The list of registered names.
    """
    return _replace_per_kind(
        seqio.MixtureRegistry,
        base_name,
        kinds,
        lambda name, kind: dict(
            tasks=[(vocab_lib.task_name(t, kind), rate) for t, rate in base_tasks_and_rates]
        ),
    )


def temperature_rate(count, temperature):
    """Unnormalised sampling rate ``count ** (1 / temperature)`` (GShard/T5).

    seqio normalises the rates of a mixture, so the probability of a task is
    ``n_i^(1/T) / sum_j n_j^(1/T)``: T=1 samples in proportion to size, large
    T tends to uniform.

    Args:
      count: number of examples of the task (>= 0).
      temperature: T > 0.

    Example:
      >>> temperature_rate(100, 2.0)
      10.0
    """
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    if count < 0:
        raise ValueError(f"count must be >= 0, got {count}")
    return float(count) ** (1.0 / temperature)
