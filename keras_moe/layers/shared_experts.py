"""Shared experts: an always-on FFN beside the routed experts (DeepSeek-MoE, Qwen2-MoE).

Every token goes through the shared expert; its output is added to the routed
experts' combined output. DeepSeek's `n_shared_experts` shared experts of
width `w` are one FFN of width `n * w`; Qwen2-MoE scales the shared output per
token by a sigmoid gate (`shared_expert_gate`, a `[d_model, 1]` projection).
"""

from __future__ import annotations

from typing import Any

import keras
from keras import ops

from keras_moe.arguments import Activation, check_values
from keras_moe.layers.dense_feedforward import DenseFeedForward
from keras_moe.tensor_types import Shape, Tensor


@keras.saving.register_keras_serializable(package="keras_moe")
class SharedExpertFeedForward(DenseFeedForward):
    """A dense FFN that every token takes, optionally gated: `sigmoid(x · g) * FFN(x)`.

    Give it to `MoeLayer(shared_experts=...)` (or `shared_d_ff=` of the
    ready-made MoE layers) to add its output to the routed experts'.

    Args:
        d_ff: hidden size (DeepSeek: `n_shared_experts * moe_intermediate_size`).
        activation: FFN activation (Qwen2-MoE and DeepSeek: "gated-silu").
        gate: multiply the output by a per-token sigmoid gate (Qwen2-MoE's
            `shared_expert_gate`).
        dropout_rate, init_scale, seed: as for `DenseFeedForward`.

    Example:
    >>> import numpy as np
    >>> shared = SharedExpertFeedForward(d_ff=32, activation="gated-silu", gate=True)
    >>> x = np.random.default_rng(0).normal(size=(2, 3, 8)).astype("float32")
    >>> y = shared(x)
    >>> ungated = DenseFeedForward.call(shared, x)
    >>> g = 1 / (1 + np.exp(-(x @ np.asarray(shared.gate_kernel))))
    >>> bool(np.allclose(y, g * np.asarray(ungated), atol=1e-6))
    True
    """

    def __init__(
        self,
        d_ff: int,
        activation: Activation = "gated-silu",
        gate: bool = False,
        dropout_rate: float = 0.0,
        init_scale: float = 1.0,
        seed: int | None = None,
        **kwargs: Any,
    ) -> None:
        check_values(dict(d_ff=d_ff))
        super().__init__(
            d_ff,
            activation=activation,
            dropout_rate=dropout_rate,
            init_scale=init_scale,
            seed=seed,
            **kwargs,
        )
        self.gate = bool(gate)

    def build(self, input_shape: Shape) -> None:
        super().build(input_shape)
        if self.gate:
            self.gate_kernel = self.add_weight(
                name="gate_kernel",
                shape=(input_shape[-1], 1),
                initializer=keras.initializers.VarianceScaling(
                    scale=self.init_scale, mode="fan_in", distribution="truncated_normal"
                ),
            )

    def call(self, x: Tensor, training: bool | None = None) -> Tensor:
        y = super().call(x, training=training)
        if self.gate:
            y = y * ops.sigmoid(ops.matmul(x, ops.cast(self.gate_kernel, x.dtype)))
        return y

    def get_config(self) -> dict[str, Any]:
        config = super().get_config()
        config.update(gate=self.gate)
        return config
