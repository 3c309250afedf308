"""How `MoeLayer` cuts a call's tokens `[B, L, d]` into routing groups `[G, S, d]` and back.

The grouping follows the layer's `group_size` ("batch", "sequence" or an integer
N) and the call's `independent_routing`; on a mesh that splits the batch the
groups stay on one shard (`keras_moe.parallel.local_groups`).
"""

from __future__ import annotations

from typing import Literal

from keras import ops

from keras_moe.parallel import local_groups
from keras_moe.tensor_types import Tensor
from keras_moe.validation import is_int

# "batch", "sequence", an integer N, or ("chunks", N): each sequence cut into groups of N.
Grouping = Literal["batch", "sequence"] | int | tuple[Literal["chunks"], int]


def grouping_for(
    x: Tensor, group_size: Literal["batch", "sequence"] | int, independent_routing: bool
) -> Grouping:
    """The grouping used for input `x`: "batch", "sequence", an int N, or
    ("chunks", N): each sequence cut into groups of N."""
    length = x.shape[1]
    if length == 1:
        return "sequence"  # cached decoding: each token alone, never over capacity
    if not independent_routing or group_size == "sequence":
        return group_size
    if group_size == "batch" or (length is not None and length <= group_size):
        return "sequence"
    return ("chunks", group_size)


def to_groups(
    x: Tensor, token_mask: Tensor, grouping: Grouping, pad_to_group_size: bool
) -> tuple[Tensor, Tensor, int]:
    """[B, L, d] -> [G, S, d] and its mask; returns the padding added."""
    d_model = x.shape[-1]
    if grouping in ("sequence", "batch") and x.shape[1] is None:
        raise ValueError(
            "MoeLayer needs a static sequence length to compute expert capacity; "
            "give the input a fixed length or set `group_size` to an integer."
        )
    if grouping == "sequence":
        return x, token_mask, 0
    if grouping == "batch" or is_int(grouping):
        axes, shards = local_groups.batch_shards(x)
        if shards > 1:  # a mesh splits the batch: no group spans two of its shards
            return local_groups.to_local_groups(
                x, token_mask, grouping, shards, axes, pad_to_group_size
            )
    if isinstance(grouping, tuple):  # each sequence cut into groups of N
        size = grouping[1]
        if x.shape[1] is None:
            raise ValueError(
                "independent_routing with an integer `group_size` needs a static sequence length."
            )
        pad = -x.shape[1] % size
        x = ops.pad(x, ((0, 0), (0, pad), (0, 0)))
        token_mask = ops.pad(token_mask, ((0, 0), (0, pad)))
        return (ops.reshape(x, (-1, size, d_model)), ops.reshape(token_mask, (-1, size)), pad)
    if grouping == "batch":
        tokens = ops.transpose(x, (1, 0, 2))  # position-major
        mask = ops.transpose(token_mask, (1, 0))
        return (ops.reshape(tokens, (1, -1, d_model)), ops.reshape(mask, (1, -1)), 0)
    tokens = ops.reshape(x, (-1, d_model))
    mask = ops.reshape(token_mask, (-1,))
    num_tokens = tokens.shape[0]
    pad = 0
    if num_tokens is not None and num_tokens % grouping:
        if not pad_to_group_size:
            raise ValueError(
                f"`group_size`={grouping} does not divide the {num_tokens} tokens "
                "of this batch; change `group_size` or set `pad_to_group_size=True`."
            )
        pad = grouping - num_tokens % grouping
        tokens = ops.pad(tokens, ((0, pad), (0, 0)))
        mask = ops.pad(mask, ((0, pad),))
    groups = ops.reshape(tokens, (-1, grouping, d_model))
    return groups, ops.reshape(mask, (-1, grouping)), pad


def from_groups(outputs: Tensor, inputs: Tensor, grouping: Grouping, pad: int) -> Tensor:
    """Inverse of `to_groups` for the layer's outputs."""
    input_shape = ops.shape(inputs)
    d_model = outputs.shape[-1]  # any per-token width: outputs, or per-expert values
    if grouping == "batch" or is_int(grouping):
        axes, shards = local_groups.batch_shards(inputs)
        if shards > 1:
            return local_groups.from_local_groups(outputs, inputs, grouping, pad, shards, axes)
    # No -1 in these shapes: it cannot be inferred for 0 sequences or 0 positions.
    if grouping == "batch":
        outputs = ops.reshape(outputs, (inputs.shape[1], input_shape[0], d_model))
        return ops.transpose(outputs, (1, 0, 2))
    if isinstance(grouping, tuple):
        outputs = ops.reshape(outputs, (input_shape[0], inputs.shape[1] + pad, d_model))
        return outputs[:, : inputs.shape[1]]
    if grouping != "sequence":
        outputs = ops.reshape(outputs, (-1, d_model))
        if pad:
            outputs = outputs[:-pad]
    return ops.reshape(outputs, (input_shape[0], input_shape[1], d_model))
