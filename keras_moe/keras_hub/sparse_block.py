"""`SparseMoeBlock`: a keras_moe `MoeLayer` with the call signature of keras-hub's MoE
blocks, so it can stand in a keras-hub decoder layer.

keras-hub's blocks take `(hidden_states, attention_mask=None, training=None)` and
return `(outputs, router_logits)` with the logits flattened to `[tokens, E]`;
the decoder layers use the outputs (and Mixtral's, with
`output_router_logits`, the logits).
"""

from __future__ import annotations

from typing import Any

import keras
from keras import ops

from keras_moe.layers.moe import MoeLayer
from keras_moe.tensor_types import Shape, Tensor


def token_mask(attention_mask: Tensor | None, hidden_states: Tensor) -> Tensor | None:
    """`[batch, length]` 1 for real tokens, from what a keras-hub decoder passes its block.

    A padding mask `[batch, length]` is that already. An attention mask
    `[batch, queries, keys]` is read on its diagonal, query i being key
    `i + keys - queries` (training and prefill: the queries are the last
    positions); a one-token call (a cached decoding step) is a real token.

    Example:
    >>> import numpy as np
    >>> causal_and_padding = np.tril(np.ones((3, 3)))[None] * np.array([1, 1, 0])[None, None]
    >>> np.asarray(token_mask(causal_and_padding, np.zeros((1, 3, 4)))).tolist()
    [[1.0, 1.0, 0.0]]
    """
    if attention_mask is None or hidden_states.shape[1] == 1:
        return None
    mask = ops.cast(attention_mask, "float32")
    if len(mask.shape) == 2:
        return mask
    queries, keys = ops.shape(mask)[1], ops.shape(mask)[2]
    key_of_query = ops.arange(queries, dtype="int32") + ops.cast(keys - queries, "int32")
    index = ops.broadcast_to(key_of_query[None, :, None], (ops.shape(mask)[0], queries, 1))
    return ops.take_along_axis(mask, index, axis=2)[..., 0]


@keras.saving.register_keras_serializable(package="keras_moe")
class SparseMoeBlock(keras.layers.Layer):
    """A keras_moe `MoeLayer` that a keras-hub decoder layer calls as its MoE block.

    `keras_moe.sparsify` puts one in every MoE decoder layer of a keras-hub
    model; build one yourself only to plug a `MoeLayer` into another model
    that calls its blocks this way.

    Args:
        moe: the `MoeLayer` (router, experts, optional shared expert) it runs.

    Example:
    >>> import numpy as np
    >>> import keras_moe
    >>> moe = keras_moe.MoeLayer(keras_moe.TopKRouter(4, k=2, normalize_top_k=True),
    ...                          keras_moe.FeedForwardExperts(4, 16, activation="gated-silu"),
    ...                          dispatch="dropless")
    >>> outputs, router_logits = SparseMoeBlock(moe)(np.ones((2, 3, 8), "float32"))
    >>> tuple(outputs.shape), tuple(router_logits.shape)
    ((2, 3, 8), (6, 4))
    """

    def __init__(self, moe: MoeLayer | dict[str, Any], **kwargs: Any) -> None:
        # Not super(): `sparsify` mixes in a keras-hub block class (for the
        # decoders' isinstance checks) whose own __init__ must not run.
        keras.layers.Layer.__init__(self, **kwargs)
        if isinstance(moe, dict):
            moe = keras.saving.deserialize_keras_object(moe)
        if not isinstance(moe, MoeLayer):
            raise ValueError(f"`moe` must be a keras_moe MoeLayer, got {type(moe).__name__}.")
        self.moe = moe
        self.num_experts = moe.num_experts

    def build(self, input_shape: Shape) -> None:
        self.moe.build(input_shape)
        self.built = True

    def call(
        self,
        hidden_states: Tensor,
        attention_mask: Tensor | None = None,
        training: bool | None = None,
    ) -> tuple[Tensor, Tensor]:
        outputs = self.moe(
            hidden_states, mask=token_mask(attention_mask, hidden_states), training=training
        )
        # A graph drops this projection when the caller does not use the logits.
        router_logits = self.moe.router(hidden_states)
        return outputs, ops.reshape(router_logits, (-1, self.num_experts))

    def compute_output_spec(
        self, hidden_states: Any, attention_mask: Any = None, training: bool | None = None
    ) -> tuple[Any, Any]:
        shape = hidden_states.shape
        tokens = None if None in shape[:2] else shape[0] * shape[1]
        return (
            keras.KerasTensor(shape, dtype=self.compute_dtype),
            keras.KerasTensor((tokens, self.num_experts), dtype="float32"),
        )

    def get_config(self) -> dict[str, Any]:
        config = keras.layers.Layer.get_config(self)
        config.update(moe=keras.saving.serialize_keras_object(self.moe))
        return config
