"""The gin job on a JAX device mesh: `MeshPlacement.mesh_shape` (and its rules) -> `configure_mesh`.

`train(mesh_shape=..., logical_axis_rules=...)` shards the model over a
`keras.distribution` mesh (expert weights over the "expert" axis, batches over
"data") before it is built; `shard_report` says, per class of variable, the
shape one device holds.
"""

import os

import keras

from keras_moe.parallel import layouts, sharding, token_exchange
from keras_moe.parallel.abstract_arrays import abstract_batch
from keras_moe.training.errors import TrainingConfigError
from keras_moe.training.log import log


def check_mesh(mesh_shape, logical_axis_rules, strategy="default"):
    """Raises `TrainingConfigError` unless the mesh arguments can be applied here.

    Args:
        mesh_shape: dict mesh axis -> size (`MeshPlacement.mesh_shape`), or None (no mesh).
        logical_axis_rules: `(logical axis, mesh axes)` pairs (`MeshPlacement.logical_axis_rules`),
            or None for `keras_moe.parallel.layouts.DEFAULT_RULES`.
        strategy: the tf.distribute strategy named beside the mesh ("default": none).

    Example:
    >>> check_mesh(None, None, "default")  # no mesh: nothing to check
    """
    if mesh_shape is None:
        if logical_axis_rules is not None:
            raise TrainingConfigError(
                "MeshPlacement.logical_axis_rules is set but its mesh_shape is not: bind "
                'MeshPlacement.mesh_shape (e.g. {"data": 2, "expert": 4}) or drop the rules.'
            )
        return
    if keras.backend.backend() != "jax":
        raise TrainingConfigError(
            f"MeshPlacement.mesh_shape={mesh_shape!r} needs KERAS_BACKEND=jax "
            f"(keras.distribution); on {keras.backend.backend()!r} use "
            'StrategyPlacement.strategy = "mirrored" / "multi_worker" / "tpu" for data '
            "parallelism, or run with KERAS_BACKEND=jax."
        )
    if strategy != "default":
        raise TrainingConfigError(
            f"MeshPlacement.mesh_shape shards over a JAX device mesh; strategy={strategy!r} is a "
            "tf.distribute strategy: bind one placement, @MeshPlacement() or @StrategyPlacement()."
        )
    import jax

    devices = keras.distribution.list_devices()
    try:  # axes, sizes, rules and the device count, before anything is written
        sharding.validate_mesh(mesh_shape, _rules(logical_axis_rules), num_devices=len(devices))
    except ValueError as e:
        hint = ""
        if "devices are available" in str(e) and jax.devices()[0].platform == "cpu":
            needed = 1
            for size in mesh_shape.values():
                needed *= int(size)
            hint = (
                f" On a CPU host, emulate {needed} devices: start the command with "
                f"XLA_FLAGS=--xla_force_host_platform_device_count={needed} "
                f"PJRT_NPROC={2 * needed} (docs/sharding.md)."
            )
        raise TrainingConfigError(f"MeshPlacement.mesh_shape={mesh_shape!r}: {e}{hint}") from None

    local = jax.local_devices()
    if cpu_threads_too_few(len(local), local[0].platform):
        log(
            f"warning: {len(local)} emulated CPU devices in this process and as many XLA "
            "client threads; queued steps can hang in a collective. Set PJRT_NPROC to more "
            f"than {len(local)} (e.g. PJRT_NPROC={2 * len(local)}), see docs/sharding.md."
        )


def batch_split(mesh_shape, logical_axis_rules, batch_size=None):
    """The mesh axes the batch dimension is split over, and over how many devices.

    Args:
        mesh_shape: dict mesh axis -> size (`MeshPlacement.mesh_shape`).
        logical_axis_rules: `(logical axis, mesh axes)` pairs, or None for the defaults.
        batch_size: the global batch; None: the split the rules intend, whatever the size.

    Returns:
        `(mesh axes tuple, number of devices)`; `((), 1)` when the batch is not split.

    Example:
    >>> batch_split({"data": 2, "expert": 4}, None)
    (('data', 'expert'), 8)
    >>> batch_split({"data": 2, "expert": 4}, None, batch_size=15)  # nothing divides 15
    ((), 1)
    """

    shape = None if batch_size is None else (batch_size,)
    axes = layouts.logical_to_mesh_axes(("batch",), _rules(logical_axis_rules), mesh_shape, shape)[
        0
    ]
    axes = () if axes is None else (axes,) if isinstance(axes, str) else tuple(axes)
    size = 1
    for axis in axes:
        size *= mesh_shape[axis]
    return axes, size


def check_batch_splits(mesh_shape, logical_axis_rules, batch_size, name="BATCH_SIZE"):
    """Raises `TrainingConfigError` unless `batch_size` splits over the mesh axes the
    batch is meant to be split over (without it the layout would silently fall back
    to a smaller split, or none, and every device would compute the whole batch).

    Args:
        mesh_shape: dict mesh axis -> size, or None (no mesh: nothing to check).
        logical_axis_rules: `(logical axis, mesh axes)` pairs, or None for the defaults.
        batch_size: the global batch.
        name: what the error calls the batch size (the setting that gave it).

    Example:
    >>> check_batch_splits({"data": 2, "expert": 4}, None, 16)
    >>> check_batch_splits({"data": 2, "expert": 4}, None, 15)
    Traceback (most recent call last):
    ...
    keras_moe.training.errors.TrainingConfigError: BATCH_SIZE=15 does not split over the device mesh {'data': 2, 'expert': 4}: the batch is split over the mesh axes ('data', 'expert') = 8 devices, so BATCH_SIZE must be a multiple of 8 (e.g. 8 or 16).
    """  # noqa: E501 - verbatim output lines
    if mesh_shape is None:
        return
    axes, size = batch_split(mesh_shape, logical_axis_rules)
    if size > 1 and batch_size % size:
        lower = batch_size // size * size
        examples = " or ".join(str(n) for n in (lower, lower + size) if n > 0)
        raise TrainingConfigError(
            f"{name}={batch_size} does not split over the device mesh {mesh_shape!r}: the "
            f"batch is split over the mesh axes {axes} = {size} devices, so {name} must "
            f"be a multiple of {size} (e.g. {examples})."
        )


def cpu_threads_too_few(num_devices, platform, environ=None, cpu_count=None):
    """Whether XLA's CPU client would run this process's devices on one thread each.

    The client's pool has max(PJRT_NPROC or the core count, device count)
    threads; exactly one per device can deadlock queued collectives.

    Args:
        num_devices: this process's devices (`jax.local_device_count()`).
        platform: their platform ("cpu", "tpu", "gpu").
        environ: the environment (default `os.environ`).
        cpu_count: the usable cores (default: this process's affinity).

    Example:
    >>> cpu_threads_too_few(8, "cpu", environ={}, cpu_count=2)
    True
    >>> cpu_threads_too_few(8, "cpu", environ={"PJRT_NPROC": "16"}, cpu_count=2)
    False
    >>> cpu_threads_too_few(8, "tpu", environ={}, cpu_count=2)
    False
    """
    if platform != "cpu" or num_devices < 2:
        return False
    environ = os.environ if environ is None else environ
    if cpu_count is None:
        cpu_count = len(os.sched_getaffinity(0))
    threads = environ.get("PJRT_NPROC", environ.get("NPROC", ""))
    threads = int(threads) if threads.strip().isdigit() else cpu_count
    return threads <= num_devices


def _rules(logical_axis_rules):
    return layouts.DEFAULT_RULES if logical_axis_rules is None else logical_axis_rules


def apply_mesh(mesh_shape, logical_axis_rules):
    """Sets the `keras.distribution` mesh (before any layer is created); returns its shape.

    Errors of the mesh come back as `TrainingConfigError` naming MeshPlacement.mesh_shape
    (`check_mesh` has already caught those it can see before the model dir
    is written).
    """

    try:
        distribution = sharding.configure_mesh(mesh_shape, _rules(logical_axis_rules))
    except ValueError as e:
        raise TrainingConfigError(f"MeshPlacement.mesh_shape={mesh_shape!r}: {e}") from None
    # Each process feeds its own rows (trainer: multihost.input_plan), so Keras
    # must not shard the per-process dataset again.
    distribution.auto_shard_dataset = False
    mesh = distribution.device_mesh
    return dict(zip(mesh.axis_names, mesh.shape, strict=False))


def shard_report(model):
    """[(class of variable, full shape, shape on one device)], one per logical-axes class.

    A variable's class is its logical axes (`keras_moe.parallel.layouts`), e.g.
    ("expert", "embed", "mlp") for the experts' `wi`; the first variable of
    each class stands for the others.
    """

    seen, rows = set(), []
    for variable in model.weights:
        axes = layouts.variable_logical_axes(variable.path, len(variable.shape))
        key = axes if axes is not None else ("replicated",)
        if key in seen:
            continue
        seen.add(key)
        value = variable.value
        sharding = getattr(value, "sharding", None)
        local = (
            tuple(sharding.shard_shape(value.shape))
            if sharding is not None
            else tuple(variable.shape)
        )
        rows.append((f"{variable.path} {key}", tuple(variable.shape), local))
    return rows


def exchange_report(model, batch_size, feature_lengths):
    """Lines saying how each MoE layer of `model` moves its expert buffers on the mesh, and why.

    Traces the model's training forward pass once over an abstract global
    batch laid out as the data is (`jax.eval_shape`: nothing is computed),
    which records each MoE layer's choice (`keras_moe.parallel.token_exchange`).

    Args:
        model: a T5-family model built under the mesh.
        batch_size: the global batch (`train.batch_size`).
        feature_lengths: `{"inputs": n, "targets": m}`.

    Returns:
        one line per MoE layer (`token_exchange.format_exchange_choices`).
    """
    import jax

    distribution = keras.distribution.distribution()
    inputs = abstract_batch(distribution, batch_size, feature_lengths)[0]
    trainable = [v.value for v in model.trainable_variables]
    non_trainable = [v.value for v in model.non_trainable_variables]

    def forward(trainable, non_trainable, inputs):
        return model.stateless_call(trainable, non_trainable, inputs, training=True)[0]

    token_exchange.clear_exchange_choices()
    jax.eval_shape(forward, trainable, non_trainable, inputs)
    choices = token_exchange.exchange_choices()
    token_exchange.clear_exchange_choices()
    return token_exchange.format_exchange_choices(choices)
