"""Logical-axis annotations and the backend-specific hooks behind them.

Layers tag key activations with logical axis names (`"batch"`, `"expert"`,
`"embed"`, ...). Without a configured mesh every annotation is a no-op, so
single-device users pay nothing. This module is the only place in the layers'
code path that looks at the backend.
"""

import keras

LOGICAL_AXES = ("batch", "length", "expert", "embed", "mlp", "heads", "kv", "vocab")

_ACTIVE_RULES = None  # set by `set_logical_axis_rules`


def accelerator_platform():
    """Returns "tpu", "gpu" or "cpu": the platform the backend computes on.

    Example:
    >>> accelerator_platform() in ("tpu", "gpu", "cpu")
    True
    """
    backend = keras.backend.backend()
    if backend == "jax":
        import jax

        return jax.devices()[0].platform
    if backend == "tensorflow":
        import tensorflow as tf

        if tf.config.list_logical_devices("TPU"):
            return "tpu"
        if tf.config.list_logical_devices("GPU"):
            return "gpu"
    return "cpu"


def set_logical_axis_rules(rules):
    """Sets the active mapping from logical axis names to mesh axis names.

    Args:
        rules: sequence of `(logical_axis, mesh_axis_or_None)` pairs, or None
            to clear.
    """
    global _ACTIVE_RULES
    if rules is not None:
        for logical, _ in rules:
            if logical not in LOGICAL_AXES:
                raise ValueError(
                    f"Unknown logical axis {logical!r} in `rules`; allowed: {LOGICAL_AXES}."
                )
    _ACTIVE_RULES = None if rules is None else tuple(rules)


def get_logical_axis_rules():
    return _ACTIVE_RULES


def with_logical_constraint(x, logical_axes):
    """Constrains the layout of `x` by logical axes when a mesh is active.

    A no-op unless a `keras.distribution` distribution (JAX backend) and
    logical axis rules are set.

    Args:
        x: a tensor.
        logical_axes: one logical axis name (or None) per dimension of `x`.

    Example:
    >>> import numpy as np
    >>> y = with_logical_constraint(np.ones((2, 3)), ("batch", "embed"))
    """
    if _ACTIVE_RULES is None or keras.backend.backend() != "jax":
        return x
    distribution = keras.distribution.distribution()
    if distribution is None:
        return x
    from keras_moe import layouts

    layout = layouts.tensor_layout(logical_axes, distribution.device_mesh, _ACTIVE_RULES)
    return keras.distribution.distribute_tensor(x, layout)
