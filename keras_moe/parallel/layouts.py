"""Logical axes, the rules that map them to mesh axes, and the variable table.

keras_moe names every dimension it cares about with a *logical* axis
(`"batch"`, `"expert"`, `"embed"`, ...). A *rule* maps a logical axis to a
*mesh* axis (`"data"`, `"expert"`, `"model"`), to several mesh axes at once, or
to None (replicated). This is the Flaxformer/T5X scheme:

- Rules are an ordered sequence of `(logical_axis, mesh_axes)` pairs; a
  logical axis may appear several times, and later entries are fallbacks.
- For one tensor, rules are tried in order. A rule applies to a dimension
  when its mesh axes all exist in the mesh, none of them is already used by
  another dimension of the same tensor, and (when the size is known) their
  product divides the dimension. Unassigned dimensions are replicated.

With `DEFAULT_RULES`, expert buffers `[E, G, C, d]` tagged
`("expert", "batch", None, "embed")` become `P("expert", "data", None, None)`
(the `("data", "expert")` rule for batch is skipped because `expert` is
taken), while tokens `[G, S, d]` tagged `("batch", "length", "embed")` become
`P(("data", "expert"), None, None)`: tokens are spread over every device, and
moving from one layout to the other is GShard's all-to-all.

Weights are tagged by `VARIABLE_AXES`, a first-match table of
`(path regex, {rank: logical axes})`; extend it with `register_variable_axes`.
The table never imports a model: it only looks at `variable.path`.

Example:
>>> logical_to_mesh_axes(("expert", "batch", None, "embed"), DEFAULT_RULES,
...                      {"data": 2, "expert": 4, "model": 1})
('expert', 'data', None, None)
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

import keras as _keras

from keras_moe import compat
from keras_moe.tensor_types import Shape

LOGICAL_AXES = ("batch", "length", "expert", "embed", "mlp", "heads", "kv", "vocab")
MESH_AXES = ("data", "expert", "model")

LogicalAxes = Sequence[str | None]  # one logical axis name (or None) per dimension
MeshAxes = str | Sequence[str] | None  # the mesh axes a logical axis maps to
Rules = Sequence[tuple[str, MeshAxes]]  # (logical_axis, mesh_axes) pairs in priority order
MeshSpec = tuple[str | tuple[str, ...] | None, ...]  # PartitionSpec-like, one entry per dim
VariableAxesTable = Sequence[tuple[str, dict[int, tuple[str | None, ...]]]]

# Order matters: "expert" is placed before "batch" so that an expert buffer
# keeps its expert dimension on the expert axis and its group dimension falls
# back to "data".
DEFAULT_RULES = (
    ("expert", "expert"),
    ("batch", ("data", "expert")),
    ("batch", "data"),
    ("length", None),
    ("embed", None),
    ("mlp", "model"),
    ("heads", "model"),
    ("kv", None),
    ("vocab", "model"),
)

# Variable path regex (matched with re.fullmatch against `variable.path`)
# -> {rank: logical axes}. First matching entry with the variable's rank wins.
_DEFAULT_VARIABLE_AXES: VariableAxesTable = (
    # MoE experts: [E, d_model, d_ff] and [E, d_ff, d_model].
    (r".*experts/wi(_0|_1)?", {3: ("expert", "embed", "mlp")}),
    (r".*experts/wo", {3: ("expert", "mlp", "embed")}),
    # Their biases (gpt-oss): [E, d_ff] and [E, d_model].
    (r".*experts/bi(_0|_1)?", {2: ("expert", "mlp")}),
    (r".*experts/bo", {2: ("expert", "embed")}),
    # Router kernel [d_model, E]: the expert dimension stays replicated (every
    # device routes its own tokens to all experts).
    (r".*router/kernel", {2: ("embed", None)}),
    # Relative position bias [num_buckets, heads].
    (r".*(relative_attention_bias|position_bias)(/embeddings)?", {2: (None, "heads")}),
    # Token embeddings [vocab, d_model].
    (
        r"(.*/)?(token_embedding|shared_embedding|token_embeddings|embedding(_\d+)?)(/embeddings)?",
        {2: ("vocab", "embed")},
    ),
    # Attention projections: joined [d, h*k] or split [d, h, k] / [h, k, d].
    (
        r"(.*/)?(query|key|value|q|k|v)(/kernel)?",
        {2: ("embed", "heads"), 3: ("embed", "heads", "kv")},
    ),
    (
        r"(.*/)?(attention_output|o)(/kernel)?|.*attention.*/(output|out)(/kernel)?",
        {2: ("heads", "embed"), 3: ("heads", "kv", "embed")},
    ),
    # Dense T5 feed-forward: wi / wi_0 / wi_1 [d, d_ff] and wo [d_ff, d].
    (r"(.*/)?wi(_0|_1)?(/kernel)?", {2: ("embed", "mlp")}),
    (r"(.*/)?wo(/kernel)?", {2: ("mlp", "embed")}),
    # Output projection to the vocabulary [d, vocab].
    (r"(.*/)?(lm_head|logits_dense|logits)(/kernel)?", {2: ("embed", "vocab")}),
)

VARIABLE_AXES: list[tuple[str, dict[int, tuple[str | None, ...]]]] = list(_DEFAULT_VARIABLE_AXES)


def _check_logical_axes(logical_axes, what):
    for axis in logical_axes:
        if axis is not None and axis not in LOGICAL_AXES:
            raise ValueError(
                f"Unknown logical axis {axis!r} in {what}; allowed: {LOGICAL_AXES} or None."
            )


def register_variable_axes(
    pattern: str, logical_axes: LogicalAxes | Mapping[int, LogicalAxes], prepend: bool = True
) -> None:
    """Adds a variable-path rule to `VARIABLE_AXES`.

    Args:
        pattern: regex matched with `re.fullmatch` against `variable.path`
            (e.g. `"decoder/.*/my_proj/kernel"`).
        logical_axes: a tuple of logical axes (one per dimension), or a dict
            `{rank: tuple}` when the same name has several ranks.
        prepend: put the rule before the built-in ones (it then wins).

    Example:
    >>> register_variable_axes(r".*my_proj/kernel", ("embed", "mlp"))
    >>> variable_logical_axes("block_0/my_proj/kernel", 2)
    ('embed', 'mlp')
    >>> reset_variable_axes()
    """
    re.compile(pattern)
    if not isinstance(logical_axes, Mapping):
        logical_axes = {len(logical_axes): tuple(logical_axes)}
    for rank, axes in logical_axes.items():
        if len(axes) != rank:
            raise ValueError(
                f"`logical_axes` for rank {rank} must have {rank} entries, got {axes!r}."
            )
        _check_logical_axes(axes, f"`logical_axes` of {pattern!r}")
    entry = (pattern, {int(r): tuple(a) for r, a in logical_axes.items()})
    if prepend:
        VARIABLE_AXES.insert(0, entry)
    else:
        VARIABLE_AXES.append(entry)


def reset_variable_axes() -> None:
    """Restores `VARIABLE_AXES` to the built-in table."""
    VARIABLE_AXES[:] = list(_DEFAULT_VARIABLE_AXES)


def variable_logical_axes(
    path: str, rank: int, table: VariableAxesTable | None = None
) -> tuple[str | None, ...] | None:
    """Logical axes of the variable at `path` with `rank` dims, or None.

    Example:
    >>> variable_logical_axes("switch/experts/wi", 3)
    ('expert', 'embed', 'mlp')
    """
    for pattern, by_rank in VARIABLE_AXES if table is None else table:
        if rank in by_rank and re.fullmatch(pattern, path):
            return by_rank[rank]
    return None


def _as_mesh_axes(value):
    if value is None:
        return ()
    if isinstance(value, str):
        return (value,)
    return tuple(value)


def validate_rules(
    rules: Rules, mesh_axis_names: Sequence[str] | None = None
) -> tuple[tuple[str, MeshAxes], ...]:
    """Checks `rules` and returns them as a tuple of pairs.

    Raises:
        ValueError: an entry is not a pair, names an unknown logical axis, or
            (when `mesh_axis_names` is given) an axis the mesh does not have.
    """
    if rules is None:
        raise ValueError("`rules` must be a sequence of (logical_axis, mesh_axes) pairs, got None.")
    out = []
    for entry in rules:
        if not isinstance(entry, (tuple, list)) or len(entry) != 2:
            raise ValueError(f"Each rule must be a (logical_axis, mesh_axes) pair, got {entry!r}.")
        logical, mesh = entry
        if logical not in LOGICAL_AXES:
            raise ValueError(
                f"Unknown logical axis {logical!r} in `rules`; allowed: {LOGICAL_AXES}."
            )
        mesh_axes = _as_mesh_axes(mesh)
        if not all(isinstance(a, str) for a in mesh_axes):
            raise ValueError(f"Mesh axes of rule {entry!r} must be strings or None.")
        if mesh_axis_names is not None:
            unknown = [a for a in mesh_axes if a not in mesh_axis_names]
            if unknown:
                raise ValueError(
                    f"Rule {entry!r} names mesh axis {unknown[0]!r}, which the mesh "
                    f"does not have; mesh axes: {tuple(mesh_axis_names)}."
                )
        if isinstance(mesh, list):
            mesh = tuple(mesh)
        out.append((logical, mesh))
    return tuple(out)


def logical_to_mesh_axes(
    logical_axes: LogicalAxes,
    rules: Rules,
    mesh_shape: Mapping[str, int],
    shape: Shape | None = None,
) -> MeshSpec:
    """Maps one tensor's logical axes to mesh axes (a PartitionSpec-like tuple).

    Args:
        logical_axes: one logical axis name or None per dimension.
        rules: `(logical_axis, mesh_axes)` pairs, in priority order.
        mesh_shape: dict mesh axis name -> size.
        shape: the tensor's shape, if known: rules whose mesh size does not
            divide a known dimension are skipped.

    Returns:
        A tuple with, per dimension, None, a mesh axis name, or a tuple of
        mesh axis names.

    Raises:
        ValueError: an unknown logical axis name.
    """
    logical_axes = tuple(logical_axes)
    _check_logical_axes(logical_axes, f"logical axes {logical_axes!r}")
    if shape is not None and len(shape) != len(logical_axes):
        raise ValueError(
            f"Got {len(logical_axes)} logical axes {logical_axes!r} for a tensor of "
            f"rank {len(shape)} (shape {tuple(shape)})."
        )
    result: list[str | tuple[str, ...] | None] = [None] * len(logical_axes)
    assigned = [False] * len(logical_axes)
    used = set()
    for logical, mesh in rules:
        if logical not in logical_axes:
            continue
        pos = logical_axes.index(logical)
        if assigned[pos]:
            continue
        mesh_axes = _as_mesh_axes(mesh)
        if any(a not in mesh_shape or a in used for a in mesh_axes):
            continue
        size = 1
        for a in mesh_axes:
            size *= mesh_shape[a]
        dim = None if shape is None else shape[pos]
        if dim is not None and dim % size:
            continue
        assigned[pos] = True
        # Axes of size 1 shard nothing; leave them out of the spec.
        kept = tuple(a for a in mesh_axes if mesh_shape[a] > 1)
        used.update(mesh_axes)
        result[pos] = None if not kept else (kept[0] if len(kept) == 1 else kept)
    return tuple(result)


def _mesh_shape(device_mesh):
    return dict(zip(device_mesh.axis_names, device_mesh.shape, strict=False))


def _make_layout(spec, device_mesh):
    if all(s is None or isinstance(s, str) for s in spec):
        return _keras.distribution.TensorLayout(spec, device_mesh)
    return MultiAxisLayout(spec, device_mesh)


def tensor_layout(
    logical_axes: LogicalAxes,
    device_mesh: _keras.distribution.DeviceMesh,
    rules: Rules,
    shape: Shape | None = None,
) -> _keras.distribution.TensorLayout:
    """The `keras.distribution.TensorLayout` of a tensor tagged `logical_axes`.

    Dimensions mapped to several mesh axes (e.g. tokens over
    `("data", "expert")`) give a `MultiAxisLayout`, whose backend layout is a
    `jax.sharding.NamedSharding` (Keras's `TensorLayout` cannot express it).

    Args:
        logical_axes: one logical axis name or None per dimension.
        device_mesh: a `keras.distribution.DeviceMesh`.
        rules: `(logical_axis, mesh_axes)` pairs.
        shape: the tensor's static shape, if known (see `logical_to_mesh_axes`).
    """
    spec = logical_to_mesh_axes(logical_axes, rules, _mesh_shape(device_mesh), shape)
    return _make_layout(spec, device_mesh)


class MultiAxisLayout(_keras.distribution.TensorLayout):
    """A `TensorLayout` whose dimensions may span several mesh axes (JAX only)."""

    def _validate_axes(self):
        if self._device_mesh:
            valid = set(self._device_mesh.axis_names)
            for entry in self._axes:
                for axis in _as_mesh_axes(entry):
                    if axis not in valid:
                        raise ValueError(
                            f"Invalid mesh axis {axis!r} for a layout; valid: {sorted(valid)}."
                        )

    @property
    def backend_layout(self) -> Any:
        if not hasattr(self, "_backend_layout"):
            import jax

            mesh = self.device_mesh.backend_mesh
            self._backend_layout = jax.sharding.NamedSharding(
                mesh, jax.sharding.PartitionSpec(*self.axes)
            )
        return self._backend_layout


class LogicalLayoutMap(_keras.distribution.LayoutMap):
    """A `LayoutMap` that falls back on the logical-axis variable table.

    Explicit entries (`layout_map["regex"] = ("model", None)`) behave as
    in Keras and take priority; paths they do not match are looked up in
    `VARIABLE_AXES` and mapped through `rules`.
    """

    def __init__(
        self,
        device_mesh: _keras.distribution.DeviceMesh,
        rules: Rules,
        variable_axes: VariableAxesTable | None = None,
    ) -> None:
        super().__init__(device_mesh)
        self.rules = tuple(rules)
        self._variable_axes = variable_axes

    def layout_for(self, path: str, shape: Shape) -> _keras.distribution.TensorLayout | None:
        """Layout of a variable at `path` with `shape`, or None (replicated)."""
        explicit = self[path]
        if explicit is not None:
            return explicit
        axes = variable_logical_axes(path, len(shape), self._variable_axes)
        if axes is None:
            return None
        mesh_shape = _mesh_shape(self.device_mesh)
        spec = logical_to_mesh_axes(axes, self.rules, mesh_shape)
        for dim, entry in zip(shape, spec, strict=False):
            size = 1
            for a in _as_mesh_axes(entry):
                size *= mesh_shape[a]
            if dim is not None and dim % size:
                raise ValueError(
                    f"Variable {path!r} of shape {tuple(shape)} (logical axes {axes}) "
                    f"cannot be sharded as {spec}: dimension {dim} is not divisible "
                    f"by the {entry!r} mesh size {size}. For expert weights the "
                    "number of experts must be divisible by the expert axis."
                )
        return _make_layout(spec, self.device_mesh)


class LogicalModelParallel(_keras.distribution.ModelParallel):
    """`ModelParallel` whose input batch and variables follow logical rules.

    Input batches are laid out as `("batch", None, ...)` under the rules,
    so with `DEFAULT_RULES` they are split over `("data", "expert")`, the
    GShard layout (Keras's own `ModelParallel` can only split the batch
    over one mesh axis).
    """

    def get_data_layout(self, data_shape: Shape) -> _keras.distribution.TensorLayout:
        axes = ("batch",) + (None,) * (len(data_shape) - 1)
        return tensor_layout(axes, self.device_mesh, self._layout_map.rules, data_shape)

    def get_variable_layout(self, variable: _keras.Variable) -> _keras.distribution.TensorLayout:
        if compat.variable_layout(variable) is not None:
            return compat.variable_layout(variable)
        layout = self._layout_map.layout_for(variable.path, variable.shape)
        if layout is not None:
            return layout
        return _keras.distribution.TensorLayout([None] * len(variable.shape), self.device_mesh)
