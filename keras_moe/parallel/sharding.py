"""Logical-axis annotations and the backend-specific hooks behind them.

Layers tag key activations with logical axis names (`"batch"`, `"expert"`,
`"embed"`, ...) through `with_logical_constraint`; weights are tagged by the
variable-path table in `keras_moe.parallel.layouts`. Without a configured mesh every
annotation is a no-op, so single-device users pay nothing. This module is the
only place in the layers' code path that looks at the backend.

- JAX backend: `configure_mesh(mesh_shape, rules)` builds a
  `keras.distribution.DeviceMesh`, a `LayoutMap` and a `ModelParallel`
  distribution, sets it, and activates the rules. Activation tags become
  `jax.lax.with_sharding_constraint`, and GSPMD inserts the all-to-all
  between token-sharded and expert-sharded layouts.
- TensorFlow backend: `keras.distribution` is not implemented, so
  `configure_mesh` refuses. Data parallelism goes through `tf.distribute`;
  expert parallelism across replicas is `keras_moe.layers.expert_parallel`. For
  TPU SPMD (`TPUStrategy(experimental_spmd_xla_partitioning=True)`),
  `configure_tpu_spmd` turns the same tags into `xla_sharding` annotations
  (unverified on TPU: on CPU XLA drops them).

Example (JAX, 8 devices; the mesh line is skipped where they are missing):
>>> import keras_moe
>>> from keras_moe.models import T5Config, build_model
>>> keras_moe.parallel.sharding.configure_mesh({"data": 2, "expert": 4})  # doctest: +SKIP
>>> model = build_model(T5Config(  # create layers after configuring the mesh
...     vocab_size=64, d_model=32, num_heads=4, d_kv=8, d_ff=64, num_encoder_layers=2,
...     num_decoder_layers=2, encoder_sparse_step=2, decoder_sparse_step=2,
...     sparse_ffn=keras_moe.SwitchFeedForward(num_experts=8, d_ff=64)))
>>> keras_moe.parallel.sharding.validate_mesh(  # the check configure_mesh does first
...     {"data": 2, "expert": 4}, num_devices=8, num_experts=model.config.num_experts)[0]
{'data': 2, 'expert': 4, 'model': 1}
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Literal

import keras
import numpy as np

from keras_moe import compat
from keras_moe.parallel import layouts
from keras_moe.parallel.layouts import DEFAULT_RULES, MESH_AXES, LogicalAxes, MeshSpec, Rules
from keras_moe.parallel.layouts import LOGICAL_AXES as LOGICAL_AXES  # re-exported
from keras_moe.tensor_types import Shape, Tensor
from keras_moe.validation import is_int

MeshShape = Mapping[str, int] | Sequence[tuple[str, int]]  # mesh axis -> size

_ACTIVE_RULES = None  # set by `set_logical_axis_rules` / `configure_mesh`
_TF_SPMD = None  # (numpy device mesh, mesh axis names) set by `configure_tpu_spmd`


def accelerator_platform() -> Literal["tpu", "gpu", "cpu"]:
    """Returns "tpu", "gpu" or "cpu": the platform the backend computes on.

    On JAX with a mesh configured (`configure_mesh`), the platform of the mesh's
    devices: compile-only TPU devices (`keras_moe.tpu_compile.compile_only`) make
    the layers pick their TPU paths on a CPU host.

    Example:
    >>> accelerator_platform() in ("tpu", "gpu", "cpu")
    True
    """
    backend = keras.backend.backend()
    if backend == "jax":
        import jax

        mesh = getattr(keras.distribution.distribution(), "device_mesh", None)
        if mesh is not None:
            return mesh.backend_mesh.devices.flat[0].platform
        return jax.devices()[0].platform
    if backend == "tensorflow":
        import tensorflow as tf

        # Listing logical devices starts TensorFlow's runtime, after which it can
        # no longer be set up for multi-worker collectives or split into logical
        # devices; until something else starts it, its physical devices answer.
        # (A TPU reached over the network is a logical device of a started runtime.)
        started = compat.tf_runtime_started()
        devices = tf.config.list_logical_devices if started else tf.config.list_physical_devices
        if devices("TPU"):
            return "tpu"
        if devices("GPU"):
            return "gpu"
    return "cpu"


def set_logical_axis_rules(rules: Rules | None) -> None:
    """Sets the active mapping from logical axis names to mesh axis names.

    Most users call `configure_mesh`, which also sets the rules.

    Args:
        rules: sequence of `(logical_axis, mesh_axes)` pairs (mesh_axes: a
            mesh axis name, a tuple of names, or None), or None to clear.
    """
    global _ACTIVE_RULES
    _ACTIVE_RULES = None if rules is None else layouts.validate_rules(rules)


def get_logical_axis_rules() -> tuple[tuple[str, layouts.MeshAxes], ...] | None:
    """The active rules, or None when no mesh is configured."""
    return _ACTIVE_RULES


def _normalize_mesh_shape(mesh_shape):
    if isinstance(mesh_shape, dict):
        items = list(mesh_shape.items())
    else:
        try:
            items = [tuple(item) for item in mesh_shape]
        except TypeError:
            items = None
        if items is None or any(len(item) != 2 for item in items):
            raise ValueError(
                "`mesh_shape` must be a dict (or sequence of pairs) mesh axis -> size, "
                f"e.g. {{'data': 2, 'expert': 4}}; got {mesh_shape!r}."
            )
    sizes = {}
    for name, size in items:
        if name not in MESH_AXES:
            raise ValueError(f"Unknown mesh axis {name!r} in `mesh_shape`; allowed: {MESH_AXES}.")
        if name in sizes:
            raise ValueError(f"Mesh axis {name!r} appears twice in `mesh_shape`.")
        if not is_int(size) or size < 1:
            raise ValueError(f"Size of mesh axis {name!r} must be an integer >= 1, got {size!r}.")
        sizes[name] = size
    # Canonical order, missing axes of size 1: rules may always name all three.
    return {name: sizes.get(name, 1) for name in MESH_AXES}


def validate_mesh(
    mesh_shape: MeshShape,
    rules: Rules = DEFAULT_RULES,
    num_devices: int | None = None,
    num_experts: int | None = None,
) -> tuple[dict[str, int], tuple[tuple[str, layouts.MeshAxes], ...]]:
    """Checks a mesh shape and rules; returns `(mesh_shape_dict, rules)`.

    Args:
        mesh_shape: dict mesh axis ("data", "expert", "model") -> size; missing
            axes get size 1.
        rules: `(logical_axis, mesh_axes)` pairs.
        num_devices: if given, the mesh size must equal it.
        num_experts: if given, must be divisible by the "expert" axis size.

    Raises:
        ValueError: naming the problem.

    Example:
    >>> validate_mesh({"data": 2, "expert": 4}, num_devices=8, num_experts=8)[0]
    {'data': 2, 'expert': 4, 'model': 1}
    """
    shape = _normalize_mesh_shape(mesh_shape)
    rules = layouts.validate_rules(rules, tuple(shape))
    total = 1
    for size in shape.values():
        total *= size
    if num_devices is not None and total != num_devices:
        raise ValueError(
            f"Mesh {shape} has {total} devices but {num_devices} devices are available; "
            "the product of the mesh axis sizes must equal the device count."
        )
    if num_experts is not None and num_experts % shape["expert"]:
        raise ValueError(
            f"`num_experts`={num_experts} is not divisible by the 'expert' mesh axis "
            f"size {shape['expert']}; every device must hold the same number of experts."
        )
    return shape, rules


def configure_mesh(
    mesh_shape: MeshShape,
    rules: Rules = DEFAULT_RULES,
    devices: Sequence[str] | None = None,
    num_experts: int | None = None,
    layout_overrides: Mapping[str, Sequence[str | None]] | None = None,
) -> keras.distribution.ModelParallel:
    """Shards keras_moe models over a device mesh (JAX backend).

    Validates the arguments, builds a `keras.distribution.DeviceMesh` with
    axes `("data", "expert", "model")`, a `LayoutMap` that lays out weights by
    `keras_moe.parallel.layouts.VARIABLE_AXES` and `rules`, and a `ModelParallel`
    distribution (input batches split by the "batch" rule), calls
    `keras.distribution.set_distribution`, and activates `rules` for
    `with_logical_constraint`. Call it before creating any layer.

    Args:
        mesh_shape: dict mesh axis -> size, e.g. `{"data": 2, "expert": 4}`;
            axes left out get size 1. The product must equal the device count.
        rules: `(logical_axis, mesh_axes)` pairs in priority order (see
            `keras_moe.parallel.layouts`); defaults to `DEFAULT_RULES`.
        devices: device strings (default: `keras.distribution.list_devices()`).
        num_experts: optional; checked for divisibility by the expert axis
            here (variables are checked again when they are created).
        layout_overrides: optional dict variable-path regex -> mesh axes
            tuple, taking priority over the logical table.

    Returns:
        The `keras.distribution.ModelParallel` distribution that was set.

    Raises:
        ValueError: bad mesh shape, mesh size != device count, unknown
            logical or mesh axis, `num_experts` not divisible by the expert
            axis, or a backend without `keras.distribution` support.

    Example:
    >>> dist = configure_mesh({"data": 2, "expert": 4})  # doctest: +SKIP
    """
    if devices is None:
        devices = keras.distribution.list_devices()
    shape, rules = validate_mesh(mesh_shape, rules, len(devices), num_experts)
    if keras.backend.backend() != "jax":
        raise ValueError(
            "configure_mesh needs the JAX backend (KERAS_BACKEND=jax): keras.distribution "
            f"is not implemented on the {keras.backend.backend()!r} backend. On TensorFlow, "
            "use tf.distribute for data parallelism and keras_moe.layers.expert_parallel for "
            "expert parallelism (or configure_tpu_spmd on Cloud TPU)."
        )
    mesh = keras.distribution.DeviceMesh(tuple(shape.values()), tuple(shape), devices=list(devices))
    layout_map = layouts.LogicalLayoutMap(mesh, rules)
    for pattern, axes in (layout_overrides or {}).items():
        layout_map[pattern] = tuple(axes)
    distribution = layouts.LogicalModelParallel(layout_map=layout_map, batch_dim_name="data")
    keras.distribution.set_distribution(distribution)
    set_logical_axis_rules(rules)
    return distribution


def clear_mesh() -> None:
    """Removes the distribution and rules set by `configure_mesh` / `configure_tpu_spmd`."""
    global _TF_SPMD
    if keras.backend.backend() == "jax":
        keras.distribution.set_distribution(None)
    _TF_SPMD = None
    set_logical_axis_rules(None)


def configure_tpu_spmd(
    mesh_shape: MeshShape, rules: Rules = DEFAULT_RULES, device_ids: Sequence[int] | None = None
) -> None:
    """Emits the logical tags as XLA SPMD annotations (TensorFlow, TPU only).

    For `tf.distribute.TPUStrategy(..., experimental_spmd_xla_partitioning=True)`
    with `num_logical_devices = prod(mesh_shape)` cores per replica: tagged
    tensors go through `xla_sharding.mesh_split`, a private TensorFlow API.
    Variables stay replicated in TF2's TPUStrategy (compute is partitioned,
    memory is not). Not run on TPU; on CPU XLA ignores the annotations.

    Args:
        mesh_shape: dict mesh axis -> size over the logical cores of a replica.
        rules: `(logical_axis, mesh_axes)` pairs.
        device_ids: logical core ids in mesh order (default `range(size)`).
    """
    global _TF_SPMD

    shape, rules = validate_mesh(mesh_shape, rules)
    if keras.backend.backend() != "tensorflow":
        raise ValueError(
            "configure_tpu_spmd is for the TensorFlow backend; on JAX use configure_mesh."
        )
    total = int(np.prod(list(shape.values())))
    ids = np.arange(total) if device_ids is None else np.asarray(device_ids)
    if ids.size != total:
        raise ValueError(f"`device_ids` has {ids.size} entries; the mesh {shape} needs {total}.")
    _TF_SPMD = (ids.reshape(tuple(shape.values())), tuple(shape))
    set_logical_axis_rules(rules)


def _tf_mesh_split(x, spec):
    xla_sharding = compat.tf_xla_sharding()

    device_mesh, names = _TF_SPMD
    mesh_shape = dict(zip(names, device_mesh.shape, strict=False))
    # mesh_split maps each tensor dim to one mesh dim: merge multi-axis
    # entries by permuting and reshaping the device mesh.
    groups = [layouts._as_mesh_axes(s) for s in spec]
    order = [a for g in groups for a in g]
    order += [a for a in names if a not in order]
    perm = [names.index(a) for a in order]
    new_shape, mapping = [], []
    for g in groups:
        if g:
            mapping.append(len(new_shape))
            new_shape.append(int(np.prod([mesh_shape[a] for a in g])))
        else:
            mapping.append(-1)
    new_shape += [mesh_shape[a] for a in order[sum(len(g) for g in groups) :]]
    mesh = np.transpose(device_mesh, perm).reshape(new_shape)
    return xla_sharding.mesh_split(x, mesh, mapping, use_sharding_op=True)


def active_mesh_shape() -> dict[str, int] | None:
    """Dict mesh axis -> size of the active mesh, or None when annotations are no-ops.

    A mesh is active when rules are set and either a `keras.distribution`
    distribution is set (JAX backend) or `configure_tpu_spmd` was called
    (TensorFlow backend).

    Example:
    >>> active_mesh_shape() is None  # no mesh configured
    True
    """
    if _ACTIVE_RULES is None:
        return None
    backend = keras.backend.backend()
    if backend == "jax":
        distribution = keras.distribution.distribution()
        mesh = getattr(distribution, "device_mesh", None)
        return None if mesh is None else dict(zip(mesh.axis_names, mesh.shape, strict=False))
    if backend == "tensorflow" and _TF_SPMD is not None:
        return dict(zip(_TF_SPMD[1], _TF_SPMD[0].shape, strict=False))
    return None


def batch_split(shape: Shape) -> tuple[tuple[str, ...], int]:
    """How the active mesh splits the first (batch) dimension of a tensor of `shape`.

    Args:
        shape: the static shape of a tensor whose first dimension is tagged
            "batch" (e.g. tokens `[batch, length, d_model]`).

    Returns:
        `(mesh_axes, shards)`: the mesh axes the rules lay the dimension out
        over (a tuple, empty when it is not split) and the number of shards,
        their sizes' product (1 without a mesh or for an unknown size).

    Example:
    >>> batch_split((8, 16, 32))  # no mesh configured
    ((), 1)
    """
    mesh_shape = active_mesh_shape()
    if mesh_shape is None or shape[0] is None:
        return (), 1
    assert _ACTIVE_RULES is not None  # a mesh is active only with rules
    logical = ("batch",) + (None,) * (len(shape) - 1)
    entry = layouts.logical_to_mesh_axes(logical, _ACTIVE_RULES, mesh_shape, tuple(shape))[0]
    axes = layouts._as_mesh_axes(entry)
    shards = 1
    for axis in axes:
        shards *= mesh_shape[axis]
    return axes, shards


def with_mesh_constraint(x: Tensor, spec: MeshSpec | Sequence[layouts.MeshAxes]) -> Tensor:
    """Constrains the layout of `x` to mesh axes `spec` when a mesh is active.

    Args:
        x: a tensor.
        spec: one entry per dimension of `x`: None, a mesh axis name, or a
            tuple of mesh axis names.

    Example:
    >>> import numpy as np
    >>> x = np.ones((2, 3))
    >>> with_mesh_constraint(x, (("data", "expert"), None)) is x  # no mesh configured
    True
    """
    if active_mesh_shape() is None:
        return x
    spec = tuple(None if not layouts._as_mesh_axes(s) else s for s in spec)
    if keras.backend.backend() == "tensorflow":
        return _tf_mesh_split(x, spec)
    mesh = keras.distribution.distribution().device_mesh
    return keras.distribution.distribute_tensor(x, layouts._make_layout(spec, mesh))


def with_logical_constraint(x: Tensor, logical_axes: LogicalAxes) -> Tensor:
    """Constrains the layout of `x` by logical axes when a mesh is active.

    A no-op (returns `x` itself) unless rules are set and either a
    `keras.distribution` distribution is active (JAX backend) or
    `configure_tpu_spmd` was called (TensorFlow backend).

    Args:
        x: a tensor.
        logical_axes: one logical axis name (or None) per dimension of `x`.

    Example:
    >>> import numpy as np
    >>> x = np.ones((2, 3))
    >>> with_logical_constraint(x, ("batch", "embed")) is x
    True
    """
    mesh_shape = active_mesh_shape()
    if mesh_shape is None:
        return x
    assert _ACTIVE_RULES is not None  # a mesh is active only with rules
    logical_axes = tuple(logical_axes)
    spec = layouts.logical_to_mesh_axes(logical_axes, _ACTIVE_RULES, mesh_shape, tuple(x.shape))
    if "expert" in logical_axes and spec[logical_axes.index("expert")]:
        # GShard's two steps: lay the expert buffer out like tokens first
        # (expert dim replicated, group dim over every device), then reshard
        # it to experts. Without the first step XLA may all-gather the
        # tokens instead of exchanging them with an all-to-all.
        token_axes = tuple(None if a == "expert" else a for a in logical_axes)
        x = with_mesh_constraint(
            x, layouts.logical_to_mesh_axes(token_axes, _ACTIVE_RULES, mesh_shape, tuple(x.shape))
        )
    return with_mesh_constraint(x, spec)
