"""Feed-forward experts with stacked weights `[E, d_model, d_ff]` / `[E, d_ff, d_model]`,
and their per-expert fan-in initializer (`PerExpertFanIn`)."""

from __future__ import annotations

import functools
import math
import random
from typing import Any

import keras
from keras import ops

from keras_moe.arguments import Activation, check_values
from keras_moe.dispatch import grouped_matmul as grouped_matmul_lib
from keras_moe.dispatch.grouped_matmul import grouped_matmul
from keras_moe.layers.feedforward_mixin import (
    SWIGLU_ALPHA,
    SWIGLU_LIMIT,
    FeedForwardMixin,
    model_width,
)
from keras_moe.tensor_types import Shape, Tensor, WeightShape

# Std of a unit normal truncated at two standard deviations.
_TRUNCATED_NORMAL_STD = 0.87962566103423978


@keras.saving.register_keras_serializable(package="keras_moe")
class PerExpertFanIn(keras.initializers.Initializer):
    """Truncated normal with std sqrt(scale / fan_in), fan_in = `shape[-2]`.

    For stacked expert kernels `[E, fan_in, fan_out]` each expert gets the
    Switch paper's scaled init; Keras's `VarianceScaling` would count
    `E * fan_in` and start every expert sqrt(E) times too small.

    Args:
        scale: variance scale (0.1 is the Switch paper's reduced init).
        seed: optional seed.

    Example:
    >>> import numpy as np
    >>> w = PerExpertFanIn(0.1)((8, 512, 64))  # [E, fan_in, fan_out]
    >>> round(float(np.std(w)) * (512 / 0.1) ** 0.5, 1)
    1.0
    """

    def __init__(self, scale: float = 0.1, seed: int | None = None) -> None:
        self.scale = float(scale)
        self.seed = seed
        # As Keras' own initializers: without a seed, draw an integer one now
        # (from Python's generator, which keras.utils.set_random_seed seeds).
        # Drawing from Keras' global SeedGenerator instead fails when the
        # weights are first built inside fit()'s traced step.
        self._draw_seed = seed if seed is not None else random.randint(1, int(1e9))

    def __call__(self, shape: WeightShape, dtype: str | None = None) -> Tensor:
        stddev = math.sqrt(self.scale / shape[-2]) / _TRUNCATED_NORMAL_STD
        return keras.random.truncated_normal(
            shape, stddev=stddev, dtype=dtype, seed=self._draw_seed
        )

    def get_config(self) -> dict[str, Any]:
        return {"scale": self.scale, "seed": self.seed}


@keras.saving.register_keras_serializable(package="keras_moe")
class FeedForwardExperts(FeedForwardMixin, keras.layers.Layer):
    """A stack of E independent feed-forward networks, run as batched matmuls.

    Input and output are expert buffers `[E, G, C, d_model]` (from a
    dispatcher). Expert `e` applies `wo[e] · act(wi[e] · x)`, or for gated
    activations `wo[e] · (act(wi_0[e] · x) * (wi_1[e] · x))`.

    Args:
        num_experts: number of experts, >= 1.
        d_ff: hidden size of each expert, >= 1.
        activation: one of "relu", "gelu", "gated-gelu", "gated-relu", "gated-silu",
            or "clamped-swiglu" (gpt-oss: `(clip(u, -limit, limit) + 1) * g *
            sigmoid(alpha * g)` with `g = min(wi_0 x, limit)`, `u = wi_1 x`).
        dropout_rate: dropout on the expert hidden activations ("expert
            dropout", Switch §3), in [0, 1).
        init_scale: variance scale of the truncated-normal fan-in init (1.0,
            T5's scale, by default; the Switch paper uses 0.1 model-wide).
        seed: dropout seed.
        use_bias: give every projection a per-expert bias (`bi_0`, `bi_1` or
            `bi` `[E, d_ff]`, `bo` `[E, d_model]`), as gpt-oss's experts have.
        swiglu_alpha: alpha of "clamped-swiglu", > 0 (gpt-oss: 1.702).
        swiglu_limit: limit of "clamped-swiglu", > 0 (gpt-oss: 7.0).

    Example:
    >>> import numpy as np
    >>> experts = FeedForwardExperts(num_experts=4, d_ff=32)
    >>> y = experts(np.ones((4, 1, 2, 8), "float32"))  # [E, G, C, d]
    >>> tuple(y.shape)
    (4, 1, 2, 8)
    """

    takes_sorted_rows = True  # call(rows, group_sizes=...): dropless dispatch

    def __init__(
        self,
        num_experts: int,
        d_ff: int,
        activation: Activation = "relu",
        dropout_rate: float = 0.0,
        init_scale: float = 1.0,
        seed: int | None = None,
        use_bias: bool = False,
        swiglu_alpha: float = SWIGLU_ALPHA,
        swiglu_limit: float = SWIGLU_LIMIT,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        check_values(dict(num_experts=num_experts, d_ff=d_ff))
        self.num_experts = num_experts
        self.d_ff = d_ff
        self.init_feed_forward(
            activation,
            dropout_rate,
            init_scale,
            seed,
            use_bias=use_bias,
            swiglu_alpha=swiglu_alpha,
            swiglu_limit=swiglu_limit,
        )

    def build(self, input_shape: Shape) -> None:
        d_model = model_width(input_shape)
        self.add_kernels(
            (self.num_experts, d_model, self.d_ff),
            (self.num_experts, self.d_ff, d_model),
            lambda shape: PerExpertFanIn(self.init_scale),
        )

    def call(
        self, inputs: Tensor, training: bool | None = None, group_sizes: Tensor | None = None
    ) -> Tensor:
        """Expert buffers `[E, G, C, d]` -> outputs of the same shape; or, with
        `group_sizes` (int `[E]`), rows `[N, d]` sorted by expert -> `[N, d]`
        (rows past `sum(group_sizes)` give 0)."""
        if group_sizes is not None:
            if grouped_matmul_lib.runs_tiled(inputs.shape[0], self.wo.shape, inputs.dtype):
                # All three projections in the tile layout: the rows move in and out once.
                tiles = grouped_matmul_lib.to_tiles(inputs, group_sizes, self.num_experts)
                y = self.feed_forward(
                    tiles.rows,
                    lambda a, w: grouped_matmul_lib.tiles_matmul(a, w, tiles.group),
                    training,
                    add_bias=lambda y, b: (
                        y + ops.take(ops.cast(b, y.dtype), tiles.group, axis=0)[:, None, :]
                    ),
                )
                return grouped_matmul_lib.from_tiles(y, tiles)
            if keras.backend.backend() == "tensorflow":
                return self._each_expert_on_its_rows(inputs, group_sizes, training)
            return self.feed_forward(
                inputs,
                lambda a, w: grouped_matmul(a, w, group_sizes),
                training,
                add_bias=self._row_bias_adder(inputs, group_sizes) if self.use_bias else None,
            )
        if keras.backend.backend() == "jax":
            # Einsums on the 4-D buffer: with the group axis sharded, a reshape
            # to [E, G*C, d] would force GSPMD to rematerialise the buffer.
            x = inputs
            project = functools.partial(ops.einsum, "egci,eio->egco")
            add_bias = lambda y, b: y + ops.cast(b, y.dtype)[:, None, None, :]  # noqa: E731
        else:
            # TensorFlow: batched matmuls on [E, G*C, d] are faster than einsum,
            # whose gradient adds transposes (measured 1.3-1.4x on CPU).
            x = ops.reshape(inputs, (self.num_experts, -1, inputs.shape[-1]))
            project = ops.matmul
            add_bias = lambda y, b: y + ops.cast(b, y.dtype)[:, None, :]  # noqa: E731
        y = self.feed_forward(x, project, training, add_bias=add_bias)
        return ops.reshape(y, ops.shape(inputs))

    def _each_expert_on_its_rows(self, rows, group_sizes, training):
        """TensorFlow: the rows split once by expert, each expert's whole FFN on its
        rows, joined once (per projection, the hidden rows would be joined and split
        again). Each weight is unstacked in one op, so its gradient is one stack."""
        import tensorflow as tf

        parts, rest = grouped_matmul_lib.split_rows(rows, group_sizes, self.num_experts)
        unstacked = {}

        def expert_weight(variable, expert):
            if id(variable) not in unstacked:
                unstacked[id(variable)] = tf.unstack(
                    ops.cast(variable, rows.dtype), num=self.num_experts
                )
            return unstacked[id(variable)][expert]

        outputs = [
            self.feed_forward(
                part, ops.matmul, training, kernel=functools.partial(expert_weight, expert=expert)
            )
            for expert, part in enumerate(parts)
        ]
        return grouped_matmul_lib.join_rows(outputs, rest)

    def _row_bias_adder(self, rows, group_sizes):
        """`add_bias(y, b)` for rows sorted by expert: row r gets its expert's bias
        (rows past `sum(group_sizes)` get none, so they stay 0)."""
        row_expert, inside = grouped_matmul_lib.row_groups(
            group_sizes, ops.shape(rows)[0], self.num_experts
        )

        def add_bias(y, b):
            bias = ops.take(ops.cast(b, y.dtype), row_expert, axis=0)
            return y + bias * ops.cast(inside, y.dtype)[:, None]

        return add_bias

    def get_config(self) -> dict[str, Any]:
        config = super().get_config()

        config.update(
            num_experts=self.num_experts,
            d_ff=self.d_ff,
            activation=self.activation,
            dropout_rate=self.dropout_rate,
            init_scale=self.init_scale,
            seed=self.seed,
            use_bias=self.use_bias,
            swiglu_alpha=self.swiglu_alpha,
            swiglu_limit=self.swiglu_limit,
        )
        return config
