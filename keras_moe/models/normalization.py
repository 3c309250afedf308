"""T5's layer norm: RMS normalisation with a learned scale (no mean, no bias)."""

import keras
from keras import ops


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
