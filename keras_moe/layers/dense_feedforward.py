"""T5's dense feed-forward layer (the FFN of the dense layers, and of shared experts)."""

from __future__ import annotations

from typing import Any

import keras
from keras import ops

from keras_moe.arguments import Activation
from keras_moe.layers.feedforward_mixin import FeedForwardMixin, model_width
from keras_moe.tensor_types import Shape, Tensor


@keras.saving.register_keras_serializable(package="keras_moe")
class DenseFeedForward(FeedForwardMixin, keras.layers.Layer):
    """T5 dense FFN without biases: `wo(dropout(act(wi x)))` or gated `wo(act(wi_0 x) * wi_1 x)`.

    Args:
        d_ff: hidden size.
        activation: one of `keras_moe.arguments.ACTIVATIONS` ("gated-gelu" is T5.1.1).
        dropout_rate: dropout on the hidden activations.
        init_scale: variance scale of the normal init, std `sqrt(init_scale /
            fan_in)` (T5: 1.0; the Switch paper scales every weight by 0.1).
        seed: dropout seed.

    Example:
    >>> import numpy as np
    >>> ffn = DenseFeedForward(d_ff=64, activation="gated-gelu")
    >>> y = ffn(np.ones((2, 3, 16), "float32"))
    >>> tuple(y.shape)
    (2, 3, 16)
    """

    def __init__(
        self,
        d_ff: int,
        activation: Activation = "gated-gelu",
        dropout_rate: float = 0.0,
        init_scale: float = 1.0,
        seed: int | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.d_ff = d_ff
        self.init_feed_forward(activation, dropout_rate, init_scale, seed)

    def build(self, input_shape: Shape) -> None:
        # Normal init with std sqrt(init_scale / fan_in), fan_in = the kernel's first axis.
        d_model = model_width(input_shape)
        self.add_kernels(
            (d_model, self.d_ff),
            (self.d_ff, d_model),
            lambda shape: keras.initializers.RandomNormal(
                stddev=(self.init_scale / shape[0]) ** 0.5
            ),
        )

    def call(self, x: Tensor, training: bool | None = None) -> Tensor:
        return self.feed_forward(x, ops.matmul, training)

    def get_config(self) -> dict[str, Any]:
        config = super().get_config()
        config.update(
            d_ff=self.d_ff,
            activation=self.activation,
            dropout_rate=self.dropout_rate,
            init_scale=self.init_scale,
            seed=self.seed,
        )
        return config
