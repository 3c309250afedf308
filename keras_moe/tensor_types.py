"""Type aliases shared by the public signatures.

`Tensor` is a backend tensor or array: a `tf.Tensor`, a JAX array, a NumPy
array or anything else `keras.ops` accepts. Keras 3 has no one tensor type
across backends, so to a type checker it is `Any`; in a signature it says
what the argument holds.

Example:
>>> from keras_moe.tensor_types import Shape, Tensor
>>> Shape
tuple[int | None, ...]
"""

from typing import Any, TypeAlias

Tensor: TypeAlias = Any
"""A backend tensor or array (TensorFlow, JAX or NumPy)."""

Shape: TypeAlias = tuple[int | None, ...]
"""A tensor shape; None for an axis known only at run time."""

WeightShape: TypeAlias = tuple[int, ...]
"""A weight's shape: every axis known."""
