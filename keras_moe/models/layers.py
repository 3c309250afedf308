"""T5 building blocks: RMS layer norm and the dense (optionally gated) FFN."""

import keras
from keras import ops

from keras_moe.experts import ACTIVATIONS, _activation_fn


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
class DenseFeedForward(keras.layers.Layer):
    """T5 dense FFN without biases: `wo(dropout(act(wi x)))` or gated `wo(act(wi_0 x) * wi_1 x)`.

    Args:
        d_ff: hidden size.
        activation: one of `keras_moe.experts.ACTIVATIONS` ("gated-gelu" is T5.1.1).
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
        if activation not in ACTIVATIONS:
            raise ValueError(f"`activation` must be one of {ACTIVATIONS}, got {activation!r}.")
        self.d_ff = d_ff
        self.activation = activation
        if not init_scale > 0:
            raise ValueError(f"`init_scale` must be > 0, got {init_scale!r}.")
        self.dropout_rate = float(dropout_rate)
        self.init_scale = float(init_scale)
        self.seed = seed
        self.gated = activation.startswith("gated-")
        self._act = _activation_fn(activation)
        self.dropout = keras.layers.Dropout(self.dropout_rate, seed=seed, dtype=self.dtype_policy)

    def build(self, input_shape):
        d_model = input_shape[-1]
        # A Keras initializer object without a seed returns the same values on
        # every call: each weight gets its own, or wi_0 and wi_1 start equal.
        def init(fan_in):
            return keras.initializers.RandomNormal(stddev=(self.init_scale / fan_in) ** 0.5)

        if self.gated:
            self.wi_0 = self.add_weight(name="wi_0", shape=(d_model, self.d_ff),
                                        initializer=init(d_model))
            self.wi_1 = self.add_weight(name="wi_1", shape=(d_model, self.d_ff),
                                        initializer=init(d_model))
        else:
            self.wi = self.add_weight(name="wi", shape=(d_model, self.d_ff),
                                      initializer=init(d_model))
        self.wo = self.add_weight(name="wo", shape=(self.d_ff, d_model),
                                  initializer=init(self.d_ff))
        self.built = True

    def call(self, x, training=None):
        if self.gated:
            h = self._act(ops.matmul(x, self.wi_0)) * ops.matmul(x, self.wi_1)
        else:
            h = self._act(ops.matmul(x, self.wi))
        h = self.dropout(h, training=training)
        return ops.matmul(h, self.wo)

    def get_config(self):
        config = super().get_config()
        config.update(d_ff=self.d_ff, activation=self.activation,
                      dropout_rate=self.dropout_rate, init_scale=self.init_scale,
                      seed=self.seed)
        return config
