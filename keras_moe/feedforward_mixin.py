"""The feed-forward computation shared by the dense FFN, the experts and the
expert-parallel experts: `wo(dropout(act(wi x)))`, or gated
`wo(dropout(act(wi_0 x) * (wi_1 x)))` (T5.1.1), without biases.

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
from typing import Any, Literal

import keras
from keras import ops

from keras_moe.tensor_types import Shape, Tensor

ACTIVATIONS = ("relu", "gelu", "gated-gelu", "gated-relu", "gated-silu")
Activation = Literal["relu", "gelu", "gated-gelu", "gated-relu", "gated-silu"]


def activation_fn(name: Activation) -> Callable[[Tensor], Tensor]:
    """The elementwise function of an activation name of `ACTIVATIONS`."""
    base = name.replace("gated-", "")
    if base == "gelu":
        # T5.1.1 uses the tanh approximation ("gelu_new").
        return lambda x: ops.gelu(x, approximate=True)
    if base == "silu":
        return ops.silu
    return ops.relu


class FeedForwardMixin:
    """Arguments, kernels and computation of a (gated) feed-forward layer.

    A Keras layer mixing this in calls `init_feed_forward` in `__init__`,
    `add_kernels` in `build` and `feed_forward` in `call`.
    """

    def init_feed_forward(self, activation: Activation, dropout_rate: float, init_scale: float,
                          seed: int | None) -> None:
        """Checks and stores the arguments; makes the activation and the dropout."""
        if activation not in ACTIVATIONS:
            raise ValueError(f"`activation` must be one of {ACTIVATIONS}, got {activation!r}.")
        if not 0.0 <= dropout_rate < 1.0:
            raise ValueError(f"`dropout_rate` must be in [0, 1), got {dropout_rate!r}.")
        if not init_scale > 0:
            raise ValueError(f"`init_scale` must be > 0, got {init_scale!r}.")
        self.activation = activation
        self.dropout_rate = float(dropout_rate)
        self.init_scale = float(init_scale)
        self.seed = seed
        self.gated = activation.startswith("gated-")
        self._act = activation_fn(activation)
        self.dropout = keras.layers.Dropout(self.dropout_rate, seed=seed, dtype=self.dtype_policy)

    def add_kernels(self, wi_shape: Shape, wo_shape: Shape,
                    initializer: Callable[[Shape], Any]) -> None:
        """Adds `wi` (gated: `wi_0`, `wi_1`) and `wo`.

        `initializer(shape)` must return a new initializer for every weight: a
        Keras initializer object without a seed repeats its values on every
        call, so a shared one would start `wi_0` and `wi_1` equal.
        """
        for name in ("wi_0", "wi_1") if self.gated else ("wi",):
            setattr(self, name, self.add_weight(name=name, shape=wi_shape,
                                                initializer=initializer(wi_shape)))
        self.wo = self.add_weight(name="wo", shape=wo_shape, initializer=initializer(wo_shape))
        self.built = True

    def feed_forward(self, x: Tensor, project: Callable[[Tensor, Any], Tensor],
                     training: bool | None,
                     kernel: Callable[[Any], Any] = lambda variable: variable) -> Tensor:
        """The FFN of `x`; `project(a, w)` multiplies by a kernel, `kernel(variable)`
        picks the part of a weight to use (all of it by default)."""
        if self.gated:
            hidden = (self._act(project(x, kernel(self.wi_0)))
                      * project(x, kernel(self.wi_1)))
        else:
            hidden = self._act(project(x, kernel(self.wi)))
        hidden = self.dropout(hidden, training=training)
        return project(hidden, kernel(self.wo))
