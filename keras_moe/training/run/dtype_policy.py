"""The Keras dtype policies a run may train under, checked and applied for one block."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import keras

from keras_moe.training.errors import TrainingConfigError

# Keras dtype policies a run may train under (`train.dtype_policy`): float32
# everywhere; float32 variables with bfloat16 compute (the routers stay float32,
# see `keras_moe.routing.base.Router`); bfloat16 variables and compute.
DTYPE_POLICIES = ("float32", "mixed_bfloat16", "bfloat16")


def check_dtype_policy(dtype_policy: str, name: str = "train.dtype_policy") -> str:
    """Returns `dtype_policy` if it is one of `DTYPE_POLICIES`, else raises.

    Args:
        dtype_policy: the policy's name, e.g. "mixed_bfloat16".
        name: the setting named in the error message.

    Raises:
        TrainingConfigError: naming the setting and the allowed values.

    Example:
    >>> check_dtype_policy("mixed_bfloat16")
    'mixed_bfloat16'
    >>> check_dtype_policy("fp16")
    Traceback (most recent call last):
    ...
    keras_moe.training.errors.TrainingConfigError: train.dtype_policy must be one of 'float32', 'mixed_bfloat16', 'bfloat16'; got 'fp16'.
    """  # noqa: E501 - verbatim output lines
    if not isinstance(dtype_policy, str) or dtype_policy not in DTYPE_POLICIES:
        allowed = ", ".join(repr(p) for p in DTYPE_POLICIES)
        raise TrainingConfigError(f"{name} must be one of {allowed}; got {dtype_policy!r}.")
    return dtype_policy


@contextlib.contextmanager
def dtype_policy_scope(dtype_policy: str) -> Iterator[None]:
    """Keras' global dtype policy is `dtype_policy` inside the block, the previous one after.

    Layers keep the policy they were built with, so building the model inside
    the block is enough; restoring it leaves a notebook's later layers as they were.

    Args:
        dtype_policy: one of `DTYPE_POLICIES`.

    Example:
    >>> import keras
    >>> before = keras.config.dtype_policy().name
    >>> with dtype_policy_scope("mixed_bfloat16"):
    ...     layer = keras.layers.Dense(2)
    >>> layer.compute_dtype, layer.variable_dtype
    ('bfloat16', 'float32')
    >>> keras.config.dtype_policy().name == before
    True
    """

    check_dtype_policy(dtype_policy)
    previous = keras.config.dtype_policy()
    keras.config.set_dtype_policy(dtype_policy)
    try:
        yield
    finally:
        keras.config.set_dtype_policy(previous)
