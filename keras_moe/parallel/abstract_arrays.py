"""Abstract arrays laid out on a device mesh, for lowering programs without values.

A `jax.ShapeDtypeStruct` that carries a `NamedSharding` stands for an argument
of a jitted function: `jax.jit(f).lower(*structs)` compiles `f` for that layout
without any array being allocated (e.g. on a TPU slice's compile-only devices).
jax is imported when a function is called, not with this module.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any


def _named_sharding(mesh: Any, layout: Any) -> Any:
    """`layout` as a `NamedSharding` on `mesh`; None is replicated."""
    import jax

    mesh = getattr(mesh, "backend_mesh", mesh)  # a keras.distribution.DeviceMesh
    layout = getattr(layout, "backend_layout", layout)  # a Keras TensorLayout
    if layout is None:
        layout = jax.sharding.PartitionSpec()
    if isinstance(layout, jax.sharding.PartitionSpec):
        return jax.sharding.NamedSharding(mesh, layout)
    return layout


def abstract_array(shape: Sequence[int], dtype: Any, mesh: Any, layout: Any = None) -> Any:
    """A `jax.ShapeDtypeStruct` of `shape` and `dtype`, sharded over `mesh`.

    Args:
        shape: the array's global shape.
        dtype: its dtype (a name such as "bfloat16" or a numpy dtype).
        mesh: a `jax.sharding.Mesh` or a `keras.distribution.DeviceMesh`.
        layout: how the array is split: a `jax.sharding.PartitionSpec` over
            `mesh`'s axes, a `jax.sharding.NamedSharding`, a Keras
            `TensorLayout` (its backend layout is used), or None: replicated
            on every device of `mesh`.

    Example:
    >>> import jax
    >>> mesh = jax.make_mesh((1,), ("data",), devices=jax.devices("cpu")[:1])
    >>> x = abstract_array((8, 4), "float32", mesh, jax.sharding.PartitionSpec("data"))
    >>> x.shape, str(x.dtype), tuple(x.sharding.spec), x.sharding.shard_shape(x.shape)
    ((8, 4), 'float32', ('data',), (8, 4))
    >>> abstract_array((3,), "int32", mesh).sharding.is_fully_replicated
    True
    """
    import jax

    return jax.ShapeDtypeStruct(tuple(shape), dtype, sharding=_named_sharding(mesh, layout))


def abstract_variables(variables: Sequence[Any], distribution: Any, dtype: Any = None) -> list:
    """Abstract arrays of Keras variables, laid out as `distribution` lays them out.

    Args:
        variables: Keras variables (values need not exist, e.g. made in a
            `keras.StatelessScope`).
        distribution: the `keras.distribution.Distribution` whose
            `get_variable_layout` places them (a variable without a layout is
            replicated over its `device_mesh`).
        dtype: the arrays' dtype; None: each variable's own.

    Returns:
        a list of `jax.ShapeDtypeStruct`, one per variable.
    """
    mesh = distribution.device_mesh
    return [
        abstract_array(v.shape, dtype or v.dtype, mesh, distribution.get_variable_layout(v))
        for v in variables
    ]


def abstract_batch(
    distribution: Any, batch_size: int, feature_lengths: Mapping[str, int]
) -> tuple[dict[str, Any], Any, Any]:
    """One batch `(inputs, targets, weights)` as abstract arrays laid out as the data is."""

    def data(shape: tuple[int, int], dtype: str) -> Any:
        return abstract_array(
            shape, dtype, distribution.device_mesh, distribution.get_data_layout(shape)
        )

    enc = (int(batch_size), int(feature_lengths["inputs"]))
    dec = (int(batch_size), int(feature_lengths["targets"]))
    inputs = {
        "encoder_input_tokens": data(enc, "int32"),
        "decoder_input_tokens": data(dec, "int32"),
        "encoder_segment_ids": data(enc, "int32"),
        "encoder_positions": data(enc, "int32"),
        "decoder_segment_ids": data(dec, "int32"),
        "decoder_positions": data(dec, "int32"),
    }
    return inputs, data(dec, "int32"), data(dec, "float32")
