"""Type predicates and the integer check behind the argument checks (a bool is not a number).

Example:
>>> is_int(3), is_int(True), is_int(3.0), is_number(0.5), is_number(False)
(True, False, False, True, False)
>>> check_int("num_experts", 0)
Traceback (most recent call last):
...
ValueError: `num_experts` must be an integer >= 1, got 0.
"""

from __future__ import annotations

import numbers
from typing import TYPE_CHECKING, Any, TypeGuard

from keras_moe.tensor_types import Shape, Tensor

if TYPE_CHECKING:
    import keras


def is_int(value: Any) -> TypeGuard[int]:
    """An integer (Python or NumPy), not a bool."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def check_int(name: str, value: Any, minimum: int = 1, error: type[Exception] = ValueError) -> None:
    """Raises `error` naming `name` unless `value` is an integer >= `minimum`."""
    if not is_int(value) or value < minimum:
        raise error(f"`{name}` must be an integer >= {minimum}, got {value!r}.")


def is_number(value: Any) -> bool:
    """A real number (Python or NumPy), not a bool."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def check_rank3_inputs(layer: keras.layers.Layer, inputs: Tensor | Shape) -> None:
    """Raises a `ValueError` naming `layer` unless `inputs` (a tensor or a shape) has
    rank 3, `[batch, length, d_model]`, as MoE layers route tokens of sequences.

    Example:
    >>> import keras
    >>> check_rank3_inputs(keras.layers.Identity(name="moe"), (2, 16))
    Traceback (most recent call last):
    ...
    ValueError: Layer 'moe' (Identity) expects inputs of shape [batch, length, d_model],
    got shape (2, 16) (rank 2). Add a length axis, e.g. `x[:, None, :]` for one token per
    example.
    """

    shape = tuple(getattr(inputs, "shape", inputs))
    if len(shape) != 3:
        raise ValueError(
            f"Layer '{layer.name}' ({type(layer).__name__}) expects inputs of shape "
            f"[batch, length, d_model], got shape {shape} (rank {len(shape)}). Add a "
            "length axis, e.g. `x[:, None, :]` for one token per example."
        )
