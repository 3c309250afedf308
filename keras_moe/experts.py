"""Feed-forward experts with stacked weights `[E, d_model, d_ff]` / `[E, d_ff, d_model]`."""

import math
import random

import keras
from keras import ops

ACTIVATIONS = ("relu", "gelu", "gated-gelu", "gated-relu", "gated-silu")


def _activation_fn(name):
    base = name.replace("gated-", "")
    if base == "gelu":
        # T5.1.1 uses the tanh approximation ("gelu_new").
        return lambda x: ops.gelu(x, approximate=True)
    if base == "silu":
        return ops.silu
    return ops.relu


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

    def __init__(self, scale=0.1, seed=None):
        self.scale = float(scale)
        self.seed = seed
        # As Keras' own initializers: without a seed, draw an integer one now
        # (from Python's generator, which keras.utils.set_random_seed seeds).
        # Drawing from Keras' global SeedGenerator instead fails when the
        # weights are first built inside fit()'s traced step.
        self._draw_seed = seed if seed is not None else random.randint(1, int(1e9))

    def __call__(self, shape, dtype=None):
        stddev = math.sqrt(self.scale / shape[-2]) / _TRUNCATED_NORMAL_STD
        return keras.random.truncated_normal(shape, stddev=stddev, dtype=dtype,
                                             seed=self._draw_seed)

    def get_config(self):
        return {"scale": self.scale, "seed": self.seed}


@keras.saving.register_keras_serializable(package="keras_moe")
class FeedForwardExperts(keras.layers.Layer):
    """A stack of E independent feed-forward networks, run as batched matmuls.

    Input and output are expert buffers `[E, G, C, d_model]` (from a
    dispatcher). Expert `e` applies `wo[e] · act(wi[e] · x)`, or for gated
    activations `wo[e] · (act(wi_0[e] · x) * (wi_1[e] · x))`.

    Args:
        num_experts: number of experts, >= 1.
        d_ff: hidden size of each expert, >= 1.
        activation: one of "relu", "gelu", "gated-gelu", "gated-relu", "gated-silu".
        dropout_rate: dropout on the expert hidden activations ("expert
            dropout", Switch §3), in [0, 1).
        init_scale: variance scale of the truncated-normal fan-in init (1.0,
            T5's scale, by default; the Switch paper uses 0.1 model-wide).
        seed: dropout seed.

    Example:
    >>> import numpy as np
    >>> experts = FeedForwardExperts(num_experts=4, d_ff=32)
    >>> y = experts(np.ones((4, 1, 2, 8), "float32"))  # [E, G, C, d]
    >>> tuple(y.shape)
    (4, 1, 2, 8)
    """

    def __init__(self, num_experts, d_ff, activation="relu", dropout_rate=0.0,
                 init_scale=1.0, seed=None, **kwargs):
        super().__init__(**kwargs)
        for name, value in (("num_experts", num_experts), ("d_ff", d_ff)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"`{name}` must be an integer >= 1, got {value!r}.")
        if activation not in ACTIVATIONS:
            raise ValueError(f"`activation` must be one of {ACTIVATIONS}, got {activation!r}.")
        if not 0.0 <= dropout_rate < 1.0:
            raise ValueError(f"`dropout_rate` must be in [0, 1), got {dropout_rate!r}.")
        if not init_scale > 0:
            raise ValueError(f"`init_scale` must be > 0, got {init_scale!r}.")
        self.num_experts = num_experts
        self.d_ff = d_ff
        self.activation = activation
        self.dropout_rate = float(dropout_rate)
        self.init_scale = float(init_scale)
        self.seed = seed
        self.gated = activation.startswith("gated-")
        self._act = _activation_fn(activation)
        self.dropout = keras.layers.Dropout(self.dropout_rate, seed=seed, dtype=self.dtype_policy)

    def build(self, input_shape):
        d_model = input_shape[-1]
        # One initializer object per weight (an initializer object may repeat
        # its values on every call).
        def init():
            return PerExpertFanIn(self.init_scale)

        wi_shape = (self.num_experts, d_model, self.d_ff)
        if self.gated:
            self.wi_0 = self.add_weight(name="wi_0", shape=wi_shape, initializer=init())
            self.wi_1 = self.add_weight(name="wi_1", shape=wi_shape, initializer=init())
        else:
            self.wi = self.add_weight(name="wi", shape=wi_shape, initializer=init())
        self.wo = self.add_weight(
            name="wo", shape=(self.num_experts, self.d_ff, d_model), initializer=init()
        )
        self.built = True

    def call(self, inputs, training=None):
        if keras.backend.backend() == "jax":
            # Einsums on the 4-D buffer: with the group axis sharded, a reshape
            # to [E, G*C, d] would force GSPMD to rematerialise the buffer.
            x = inputs
            project = lambda a, w: ops.einsum("egci,eio->egco", a, w)  # noqa: E731
        else:
            # TensorFlow: batched matmuls on [E, G*C, d] are faster than einsum,
            # whose gradient adds transposes (measured 1.3-1.4x on CPU).
            x = ops.reshape(inputs, (self.num_experts, -1, inputs.shape[-1]))
            project = ops.matmul
        if self.gated:
            hidden = self._act(project(x, self.wi_0)) * project(x, self.wi_1)
        else:
            hidden = self._act(project(x, self.wi))
        hidden = self.dropout(hidden, training=training)
        y = project(hidden, self.wo)
        return ops.reshape(y, ops.shape(inputs))

    def get_config(self):
        config = super().get_config()
        config.update(
            num_experts=self.num_experts,
            d_ff=self.d_ff,
            activation=self.activation,
            dropout_rate=self.dropout_rate,
            init_scale=self.init_scale,
            seed=self.seed,
        )
        return config
