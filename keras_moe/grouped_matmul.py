"""Grouped matmul: rows sorted by group, each group multiplied by its own matrix.

`grouped_matmul(x, w, group_sizes)` with `x` `[N, k]`, `w` `[E, k, n]` and
int `group_sizes` `[E]` returns `y` `[N, n]`: the first `group_sizes[0]` rows
times `w[0]`, the next `group_sizes[1]` rows times `w[1]`, and so on; rows
past `sum(group_sizes)` give 0. It is the dropless dispatcher's expert
computation: every expert multiplies exactly the tokens routed to it.

No `keras.ops` function does this, so it is written per backend:

- TensorFlow: the rows are split at the group sizes (known at run time) and
  each group meets its matrix in one matmul. The expert axis of `w` is
  unstacked in one op, so its gradient is one stack (slicing `w[e]` E times
  would give E full-size gradients). Shapes are dynamic: graph and eager
  mode, not XLA (`jit_compile=True` raises, naming the alternative).
- JAX: `jax.lax.ragged_dot`, XLA's grouped matmul. On CPU XLA computes it as
  one dense matmul per group over all rows (7-100x one dense matmul at
  E = 8-128, measured); it pays off where XLA has a grouped kernel.
"""

import keras
from keras import ops


def grouped_matmul(x, w, group_sizes):
    """Rows of `x`, sorted by group, times their group's matrix in `w`.

    Args:
        x: `[N, k]` rows, group 0's first.
        w: `[E, k, n]` one matrix per group.
        group_sizes: int `[E]`, rows per group, summing to at most N.

    Returns:
        `[N, n]`, 0 for rows past `sum(group_sizes)`.

    Example:
    >>> import numpy as np
    >>> x = np.arange(8, dtype="float32").reshape(4, 2)
    >>> w = np.stack([np.eye(2), 2 * np.eye(2)]).astype("float32")  # group 1 doubles
    >>> np.asarray(grouped_matmul(x, w, np.array([1, 2]))).tolist()
    [[0.0, 1.0], [4.0, 6.0], [8.0, 10.0], [0.0, 0.0]]
    """
    backend = keras.backend.backend()
    x = ops.convert_to_tensor(x)
    w = ops.cast(w, x.dtype)  # a variable's (autocast) value, in the rows' dtype
    if backend == "tensorflow":
        return _tensorflow_grouped_matmul(x, w, group_sizes)
    if backend == "jax":
        return _jax_grouped_matmul(x, w, group_sizes)
    raise NotImplementedError(
        f"dispatch='dropless' runs on the tensorflow and jax backends, not {backend!r}; "
        "use dispatch='gather'.")


def in_xla_compilation():
    """True while TensorFlow traces a function for XLA (`jit_compile=True`)."""
    import tensorflow as tf
    from tensorflow.python.ops import control_flow_util

    return control_flow_util.GraphOrParentsInXlaContext(tf.compat.v1.get_default_graph())


def _tensorflow_grouped_matmul(x, w, group_sizes):
    import tensorflow as tf

    if in_xla_compilation():
        raise ValueError(
            "dispatch='dropless' gives each expert as many tokens as were routed to it, "
            "which XLA cannot compile (it needs static shapes): compile without "
            "jit_compile=True, or use dispatch='gather' (or 'einsum') with a capacity factor.")
    num_groups = w.shape[0]
    sizes = tf.cast(group_sizes, "int32")
    rest = tf.shape(x)[0] - tf.reduce_sum(sizes)
    parts = tf.split(x, tf.concat([sizes, rest[None]], axis=0), num=num_groups + 1)
    matrices = tf.unstack(w, num=num_groups)
    outputs = [tf.matmul(rows, m) for rows, m in zip(parts[:-1], matrices)]
    outputs.append(tf.zeros(tf.stack([rest, tf.shape(w)[-1]]), dtype=outputs[0].dtype))
    return tf.concat(outputs, axis=0)


def _jax_grouped_matmul(x, w, group_sizes):
    import jax

    sizes = ops.cast(group_sizes, "int32")
    y = jax.lax.ragged_dot(x, w, sizes)
    # Rows past the groups: zero them here rather than rely on the primitive.
    inside = ops.arange(ops.shape(x)[0]) < ops.sum(sizes)
    return ops.where(inside[:, None], y, ops.zeros_like(y))
