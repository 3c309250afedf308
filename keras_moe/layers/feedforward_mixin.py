"""The feed-forward computation shared by the dense FFN, the experts and the
expert-parallel experts: `wo(dropout(act(wi x)))`, or gated
`wo(dropout(act(wi_0 x) * (wi_1 x)))` (T5.1.1), optionally with biases (`bi`/`bi_0`/`bi_1`,
`bo`), and gpt-oss's "clamped-swiglu": `(clip(u, -L, L) + 1) * g * sigmoid(alpha * g)`,
`g = min(wi_0 x, L)`, `u = wi_1 x` (alpha 1.702, L 7.0 by default).

Example:
>>> import keras
>>> import numpy as np
>>> class TinyFFN(FeedForwardMixin, keras.layers.Layer):
...     def __init__(self, **kwargs):
...         super().__init__(**kwargs)
...         self.init_feed_forward("gated-relu", dropout_rate=0.0, init_scale=1.0, seed=None)
...     def build(self, input_shape):
...         self.add_kernels((input_shape[-1], 4), (4, input_shape[-1]),
...                          lambda shape: keras.initializers.Ones())
...     def call(self, x, training=None):
...         return self.feed_forward(x, keras.ops.matmul, training)
>>> # relu(1+1) * (1+1) = 4 per hidden unit; 4 units into each output: 16
>>> keras.ops.convert_to_numpy(TinyFFN()(np.ones((1, 2), "float32"))).tolist()
[[16.0, 16.0]]
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import keras
from keras import ops

from keras_moe.arguments import Activation, check_values
from keras_moe.mixin_bases import LayerMixinBase
from keras_moe.tensor_types import Shape, Tensor, WeightShape

# gpt-oss's expert activation constants (HF `GptOssExperts`: alpha, `swiglu_limit`).
SWIGLU_ALPHA = 1.702
SWIGLU_LIMIT = 7.0


def activation_fn(name: Activation) -> Callable[[Tensor], Tensor]:
    """The elementwise function of an activation name of `ACTIVATIONS`."""
    if name == "clamped-swiglu":
        raise ValueError('"clamped-swiglu" is a gated pair function: use `gated_hidden`.')
    base = name.replace("gated-", "")
    if base == "gelu":
        # T5.1.1 uses the tanh approximation ("gelu_new").
        return lambda x: ops.gelu(x, approximate=True)
    if base == "silu":
        return ops.silu
    return ops.relu


def model_width(input_shape: Shape) -> int:
    """The last axis of `input_shape` (d_model), which must be known to build weights.

    Example:
    >>> model_width((None, 7, 16))
    16
    """
    width = input_shape[-1]
    if width is None:
        raise ValueError(
            f"the inputs' last axis (d_model) must be known to build the weights, got shape "
            f"{tuple(input_shape)}."
        )
    return width


class FeedForwardMixin(LayerMixinBase):
    """Arguments, kernels and computation of a (gated) feed-forward layer.

    A Keras layer mixing this in calls `init_feed_forward` in `__init__`,
    `add_kernels` in `build` and `feed_forward` in `call`.
    """

    def init_feed_forward(
        self,
        activation: Activation,
        dropout_rate: float,
        init_scale: float,
        seed: int | None,
        use_bias: bool = False,
        swiglu_alpha: float = SWIGLU_ALPHA,
        swiglu_limit: float = SWIGLU_LIMIT,
    ) -> None:
        """Checks and stores the arguments; makes the activation and the dropout."""
        check_values(
            dict(
                activation=activation,
                dropout_rate=dropout_rate,
                init_scale=init_scale,
                swiglu_alpha=swiglu_alpha,
                swiglu_limit=swiglu_limit,
            )
        )
        self.activation = activation
        self.use_bias = bool(use_bias)
        self.swiglu_alpha = float(swiglu_alpha)
        self.swiglu_limit = float(swiglu_limit)
        self.dropout_rate = float(dropout_rate)
        self.init_scale = float(init_scale)
        self.seed = seed
        self.gated = activation.startswith("gated-") or activation == "clamped-swiglu"
        self._act: Callable[[Tensor], Tensor] | None = (
            None if activation == "clamped-swiglu" else activation_fn(activation)
        )
        self.dropout = keras.layers.Dropout(self.dropout_rate, seed=seed, dtype=self.dtype_policy)

    def add_kernels(
        self,
        wi_shape: WeightShape,
        wo_shape: WeightShape,
        initializer: Callable[[WeightShape], Any],
    ) -> None:
        """Adds `wi` (gated: `wi_0`, `wi_1`) and `wo`, and with `use_bias` their
        biases `bi` (`bi_0`, `bi_1`) and `bo`, shaped as the kernels without
        their input axis.

        `initializer(shape)` must return a new initializer for every weight: a
        Keras initializer object without a seed repeats its values on every
        call, so a shared one would start `wi_0` and `wi_1` equal.
        """
        for name in self.input_kernel_names():
            setattr(
                self,
                name,
                self.add_weight(name=name, shape=wi_shape, initializer=initializer(wi_shape)),
            )
        self.wo = self.add_weight(name="wo", shape=wo_shape, initializer=initializer(wo_shape))
        if self.use_bias:
            for name in self.input_kernel_names():
                setattr(
                    self,
                    "b" + name[1:],
                    self.add_weight(
                        name="b" + name[1:],
                        shape=tuple(wi_shape[:-2]) + (wi_shape[-1],),
                        initializer="zeros",
                    ),
                )
            self.bo = self.add_weight(
                name="bo", shape=tuple(wo_shape[:-2]) + (wo_shape[-1],), initializer="zeros"
            )
        self.built = True

    def input_kernel_names(self) -> tuple[str, ...]:
        """`("wi_0", "wi_1")` for gated activations, else `("wi",)`."""
        return ("wi_0", "wi_1") if self.gated else ("wi",)

    def gated_hidden(self, gate: Tensor, up: Tensor) -> Tensor:
        """The hidden units of a gated FFN from its two projections."""
        if self.activation == "clamped-swiglu":
            gate = ops.minimum(gate, self.swiglu_limit)
            up = ops.clip(up, -self.swiglu_limit, self.swiglu_limit)
            return (up + 1.0) * gate * ops.sigmoid(self.swiglu_alpha * gate)
        assert self._act is not None  # only clamped-swiglu has none, returned above
        return self._act(gate) * up

    def feed_forward(
        self,
        x: Tensor,
        project: Callable[[Tensor, Any], Tensor],
        training: bool | None,
        kernel: Callable[[Any], Any] = lambda variable: variable,
        add_bias: Callable[[Tensor, Any], Tensor] | None = None,
    ) -> Tensor:
        """The FFN of `x`; `project(a, w)` multiplies by a kernel, `kernel(variable)`
        picks the part of a weight to use (all of it by default), and with
        `use_bias`, `add_bias(y, b)` adds a bias to a projection (by default
        broadcast over the leading axes)."""
        if self.use_bias and add_bias is None:
            add_bias = lambda y, b: y + ops.cast(b, y.dtype)  # noqa: E731

        def linear(a, name):
            y = project(a, kernel(getattr(self, name)))
            if self.use_bias:
                y = add_bias(y, kernel(getattr(self, "b" + name[1:])))
            return y

        if self.gated:
            hidden = self.gated_hidden(linear(x, "wi_0"), linear(x, "wi_1"))
        else:
            assert self._act is not None  # clamped-swiglu is gated
            hidden = self._act(linear(x, "wi"))
        hidden = self.dropout(hidden, training=training)
        return linear(hidden, "wo")
