"""Routing groups that stay on one shard of a mesh-split batch (GShard: groups split over devices).

On a device mesh the batch `[B, L, d]` is split over some mesh axes (the
"batch" rule, e.g. `("data", "expert")`) into `n` local shards of `B / n`
sequences. A routing group holding tokens of two shards would make the
compiler gather tokens across devices, so on a mesh:

- `group_size="batch"` is one group per shard: its local batch, position-major
  (every local sequence's token 0, then every token 1, ...), as each replica's
  batch is one group under `tf.distribute`. `n` groups of `L * B / n` tokens.
- an integer `group_size` N cuts each shard's tokens (batch-major, as without
  a mesh) into groups of N; N must divide them unless `pad_to_group_size`,
  which pads each shard.

Without a mesh, or when the mesh does not split the batch, `shards` is 1 and
`MoeLayer` keeps its single-device grouping. The groups tensor is laid out
over the same mesh axes as the batch, so the reshapes stay on each device.

Example (no mesh: one shard):
>>> import numpy as np
>>> x = np.arange(2 * 3 * 1, dtype="float32").reshape(2, 3, 1)
>>> groups, mask, pad = to_local_groups(x, np.ones((2, 3)), "batch", shards=1, axes=())
>>> np.asarray(groups)[..., 0].tolist()  # position-major: each position of both sequences
[[0.0, 3.0, 1.0, 4.0, 2.0, 5.0]]
>>> y = from_local_groups(groups, x, "batch", pad, shards=1, axes=())
>>> np.asarray(y).tolist() == x.tolist()
True
"""

from __future__ import annotations

from typing import Literal

from keras import ops

from keras_moe.parallel import sharding
from keras_moe.tensor_types import Tensor


def batch_shards(x: Tensor) -> tuple[tuple[str, ...], int]:
    """`(mesh axes, shards)`: how the active mesh splits the batch of tokens `x` `[B, L, d]`.

    Args:
        x: the layer's input tokens.

    Returns:
        The mesh axes the batch is laid out over (empty without a mesh) and
        the number of local shards of the batch (1 without a mesh).

    Example:
    >>> import numpy as np
    >>> batch_shards(np.zeros((4, 8, 16)))
    ((), 1)
    """
    return sharding.batch_split(tuple(x.shape))


def _constrain(x, axes):
    return sharding.with_mesh_constraint(x, (axes,) + (None,) * (len(x.shape) - 1))


def to_local_groups(
    x: Tensor,
    token_mask: Tensor,
    grouping: Literal["batch"] | int,
    shards: int,
    axes: tuple[str, ...],
    pad_to_group_size: bool = False,
) -> tuple[Tensor, Tensor, int]:
    """Tokens `[B, L, d]` and their mask `[B, L]` as groups that never span shards.

    Args:
        x: tokens `[B, L, d]`, `B` static and divisible by `shards`.
        token_mask: `[B, L]` (1 for real tokens, 0 for padding).
        grouping: "batch" or an integer group size.
        shards: local shards of the batch (`batch_shards`).
        axes: the mesh axes the batch is split over.
        pad_to_group_size: pad each shard's tokens up to a multiple of an
            integer `grouping` instead of raising.

    Returns:
        `(groups [G, S, d], mask [G, S], pad)`: G is a multiple of `shards`,
        shard i holds groups `i * G / shards` up to the next shard's; `pad`
        is the padding added to each shard's tokens.

    Raises:
        ValueError: an integer `grouping` that does not divide a shard's
            tokens and `pad_to_group_size` is False.
    """
    batch, length, d_model = x.shape
    local = batch // shards
    x = _constrain(x, axes)
    token_mask = _constrain(token_mask, axes)
    if grouping == "batch":
        tokens = ops.transpose(ops.reshape(x, (shards, local, length, d_model)), (0, 2, 1, 3))
        mask = ops.transpose(ops.reshape(token_mask, (shards, local, length)), (0, 2, 1))
        groups = ops.reshape(tokens, (shards, length * local, d_model))
        return _constrain(groups, axes), _constrain(ops.reshape(mask, (shards, -1)), axes), 0
    num_tokens = local * length
    pad = -num_tokens % grouping
    if pad and not pad_to_group_size:
        raise ValueError(
            f"`group_size`={grouping} does not divide the {num_tokens} tokens of each of the "
            f"{shards} shards the mesh splits this batch of {batch} sequences into (over "
            f"{axes}); a group never spans two shards. Change `group_size` or set "
            "`pad_to_group_size=True`."
        )
    tokens = ops.reshape(x, (shards, num_tokens, d_model))
    mask = ops.reshape(token_mask, (shards, num_tokens))
    if pad:
        tokens = ops.pad(tokens, ((0, 0), (0, pad), (0, 0)))
        mask = ops.pad(mask, ((0, 0), (0, pad)))
    groups = ops.reshape(tokens, (-1, grouping, d_model))
    return _constrain(groups, axes), _constrain(ops.reshape(mask, (-1, grouping)), axes), pad


def from_local_groups(
    outputs: Tensor,
    inputs: Tensor,
    grouping: Literal["batch"] | int,
    pad: int,
    shards: int,
    axes: tuple[str, ...],
) -> Tensor:
    """Inverse of `to_local_groups` for outputs `[G, S, d]`: `[B, L, d]`, batch and length
    as `inputs`' (d is the outputs' own: per-expert values come back too).

    Args:
        outputs: the groups' outputs.
        inputs: the layer's input tokens (for the shape).
        grouping, pad, shards, axes: as given to and returned by `to_local_groups`.
    """
    batch, length = inputs.shape[:2]
    d_model = outputs.shape[-1]
    local = batch // shards
    outputs = _constrain(outputs, axes)
    if grouping == "batch":
        outputs = ops.reshape(outputs, (shards, length, local, d_model))
        outputs = ops.transpose(outputs, (0, 2, 1, 3))
    else:
        outputs = ops.reshape(outputs, (shards, local * length + pad, d_model))
        if pad:
            outputs = outputs[:, : local * length]
    return _constrain(ops.reshape(outputs, (batch, length, d_model)), axes)
