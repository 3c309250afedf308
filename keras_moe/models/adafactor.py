"""Adafactor that stays finite where an expert's gradient is zero, and dense on sparse gradients.

Keras 3.15's `keras.optimizers.Adafactor` has two faults that MoE training
meets on the first steps:

1. For a factored (rank >= 2) variable it forms the second-moment estimate
   `v = (r / mean(r)) * c` and divides by `sqrt(v)`. Where a row of the
   gradient is exactly zero (a ReLU unit no token of the batch activated, a
   hidden unit expert dropout removed, an expert that got a few tokens), `r`
   is `epsilon_1` (1e-30) and the product underflows to 0 in float32 (CPUs
   flush subnormals), so the update is `0 / 0 = NaN` and the weights are NaN
   from the next step on.
2. On TensorFlow an embedding's gradient is a `tf.IndexedSlices` whose indices
   repeat (a token id, a relative-position bucket). Keras' sparse arithmetic
   squares each repeated slice on its own (`sum(g_i^2)` instead of
   `(sum g_i)^2`), and once a NaN has reached the divisor its union-of-indices
   path gathers with sums of positions as indices, failing with
   `indices[0] = 1211771867 is not in [0, 65537)`.

This subclass keeps Keras' hyperparameters, slots (`r`, `c`, `v`) and
checkpoints, and computes the same update as T5's Adafactor does: the
gradient times `rsqrt(r) * sqrt(mean(r))` per row and `rsqrt(c)` per column,
never forming the product, from the dense gradient.
"""

import keras
from keras import ops


def _dense(gradient):
    """A TensorFlow `IndexedSlices` gradient as a dense tensor (repeated indices summed)."""
    if hasattr(gradient, "indices") and hasattr(gradient, "dense_shape"):
        import tensorflow as tf

        return tf.convert_to_tensor(gradient)
    return gradient


@keras.saving.register_keras_serializable(package="keras_moe")
class Adafactor(keras.optimizers.Adafactor):
    """`keras.optimizers.Adafactor` (same arguments, slots and checkpoints) without its NaN
    on zero-gradient rows and its miscounted sparse gradients (see the module docstring).

    Args:
        **kwargs: `keras.optimizers.Adafactor`'s arguments (`learning_rate`,
            `beta_2_decay`, `epsilon_1`, `epsilon_2`, `clip_threshold`,
            `relative_step`, and the base optimizer's).

    Example:
    >>> import numpy as np
    >>> weights = keras.Variable(np.ones((3, 2), "float32"))
    >>> gradient = np.array([[0.1, 1e-9], [0.0, 0.0], [0.1, 1e-9]], "float32")  # a dead unit
    >>> Adafactor(learning_rate=0.01).apply([gradient], [weights])  # Keras': all NaN
    >>> print(np.round(keras.ops.convert_to_numpy(weights), 2))
    [[0.99 0.99]
     [1.   1.  ]
     [0.99 0.99]]
    """

    def update_step(self, gradient, variable, learning_rate):
        dtype = variable.dtype
        gradient = ops.cast(_dense(gradient), dtype)
        step = ops.cast(self.iterations + 1, dtype)
        epsilon_1 = ops.cast(self.epsilon_1, dtype)
        rho = ops.minimum(ops.cast(learning_rate, dtype), ops.rsqrt(step))
        alpha = ops.maximum(ops.cast(self.epsilon_2, dtype), self._rms(variable)) * rho
        decay = 1.0 - ops.power(step, ops.cast(self.beta_2_decay, dtype))
        squared = ops.square(gradient) + epsilon_1
        index = self._get_variable_index(variable)
        r, c, v = self._r[index], self._c[index], self._v[index]

        if len(variable.shape) >= 2:
            self.assign(r, decay * r + (1.0 - decay) * ops.mean(squared, axis=-1))
            self.assign(c, decay * c + (1.0 - decay) * ops.mean(squared, axis=-2))
            # The floors only matter before a first update (slots of a state
            # restored without them); r and c are >= epsilon_1 after one.
            r_value, c_value = ops.maximum(r, epsilon_1), ops.maximum(c, epsilon_1)
            row_mean = ops.mean(r_value, axis=-1, keepdims=True)
            row_factor = ops.rsqrt(r_value) * ops.sqrt(row_mean)
            update = (
                gradient * ops.expand_dims(row_factor, -1) * ops.expand_dims(ops.rsqrt(c_value), -2)
            )
            # Keras keeps the factored estimate in `v`; kept for its checkpoints.
            self.assign(v, ops.expand_dims(r_value / row_mean, -1) * ops.expand_dims(c_value, -2))
        else:
            self.assign(v, decay * v + (1.0 - decay) * squared)
            update = gradient * ops.rsqrt(ops.maximum(v, epsilon_1))

        clip = ops.maximum(1.0, self._rms(update) / ops.cast(self.clip_threshold, dtype))
        self.assign_sub(variable, alpha * update / clip)
