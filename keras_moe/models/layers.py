"""T5 building blocks: RMS layer norm and the dense (optionally gated) FFN."""

import keras
from keras import ops

from keras_moe.ffn import FeedForwardMixin


@keras.saving.register_keras_serializable(package="keras_moe")
class RMSNorm(keras.layers.Layer):
    """T5 layer norm: scale only, no mean subtraction, no bias.

    `y = x * rsqrt(mean(x**2) + epsilon) * scale`, computed in float32.

    Args:
        epsilon: added to the mean square.

    Example:
    >>> import numpy as np
    >>> y = RMSNorm()(np.full((2, 3, 8), 3.0, "float32"))  # x / rms(x), scale starts at 1
    >>> tuple(y.shape), round(float(y[0, 0, 0]), 4)
    ((2, 3, 8), 1.0)
    """

    def __init__(self, epsilon=1e-6, **kwargs):
        super().__init__(**kwargs)
        self.epsilon = float(epsilon)

    def build(self, input_shape):
        self.scale = self.add_weight(name="scale", shape=(input_shape[-1],), initializer="ones")
        self.built = True

    def call(self, x):
        x32 = ops.cast(x, "float32")
        variance = ops.mean(ops.square(x32), axis=-1, keepdims=True)
        y = x32 * ops.rsqrt(variance + self.epsilon)
        return ops.cast(y * ops.cast(self.scale, "float32"), self.compute_dtype)

    def get_config(self):
        config = super().get_config()
        config.update(epsilon=self.epsilon)
        return config


@keras.saving.register_keras_serializable(package="keras_moe")
class DenseFeedForward(FeedForwardMixin, keras.layers.Layer):
    """T5 dense FFN without biases: `wo(dropout(act(wi x)))` or gated `wo(act(wi_0 x) * wi_1 x)`.

    Args:
        d_ff: hidden size.
        activation: one of `keras_moe.ffn.ACTIVATIONS` ("gated-gelu" is T5.1.1).
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

    def __init__(self, d_ff, activation="gated-gelu", dropout_rate=0.0, init_scale=1.0,
                 seed=None, **kwargs):
        super().__init__(**kwargs)
        self.d_ff = d_ff
        self.init_feed_forward(activation, dropout_rate, init_scale, seed)

    def build(self, input_shape):
        # Normal init with std sqrt(init_scale / fan_in), fan_in = the kernel's first axis.
        self.add_kernels((input_shape[-1], self.d_ff), (self.d_ff, input_shape[-1]),
                         lambda shape: keras.initializers.RandomNormal(
                             stddev=(self.init_scale / shape[0]) ** 0.5))

    def call(self, x, training=None):
        return self.feed_forward(x, ops.matmul, training)

    def get_config(self):
        config = super().get_config()
        config.update(d_ff=self.d_ff, activation=self.activation,
                      dropout_rate=self.dropout_rate, init_scale=self.init_scale,
                      seed=self.seed)
        return config
