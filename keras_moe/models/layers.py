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
    >>> y = RMSNorm()(np.ones((2, 3, 8), "float32"))
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
        seed: dropout seed.

    Example:
    >>> ffn = DenseFeedForward(d_ff=64, activation="gated-gelu")
    >>> y = ffn(np.ones((2, 3, 16), "float32"))
    """

    def __init__(self, d_ff, activation="gated-gelu", dropout_rate=0.0, seed=None, **kwargs):
        super().__init__(**kwargs)
        if activation not in ACTIVATIONS:
            raise ValueError(f"`activation` must be one of {ACTIVATIONS}, got {activation!r}.")
        self.d_ff = d_ff
        self.activation = activation
        self.dropout_rate = float(dropout_rate)
        self.seed = seed
        self.gated = activation.startswith("gated-")
        self._act = _activation_fn(activation)
        self.dropout = keras.layers.Dropout(self.dropout_rate, seed=seed, dtype=self.dtype_policy)

    def build(self, input_shape):
        d_model = input_shape[-1]
        init_in = keras.initializers.RandomNormal(stddev=d_model ** -0.5)
        init_out = keras.initializers.RandomNormal(stddev=self.d_ff ** -0.5)
        if self.gated:
            self.wi_0 = self.add_weight(name="wi_0", shape=(d_model, self.d_ff), initializer=init_in)
            self.wi_1 = self.add_weight(name="wi_1", shape=(d_model, self.d_ff), initializer=init_in)
        else:
            self.wi = self.add_weight(name="wi", shape=(d_model, self.d_ff), initializer=init_in)
        self.wo = self.add_weight(name="wo", shape=(self.d_ff, d_model), initializer=init_out)
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
                      dropout_rate=self.dropout_rate, seed=self.seed)
        return config
