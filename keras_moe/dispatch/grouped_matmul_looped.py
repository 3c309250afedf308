"""The "looped" kernel of `keras_moe.dispatch.grouped_matmul` (JAX, large matrices on a CPU).

A loop over the used steps of `m` rows of one group, each a dynamic slice of the
rows times its group's matrix written in place (no copy of the matrices); its
gradient is two such loops. `grouped_matmul`'s module docstring compares the kernels.
"""

from __future__ import annotations

from keras import ops


def loop_rows(num_rows: int, num_groups: int) -> int:
    """Rows per step of the "looped" kernel: the largest power of 2 at most half a
    group's average rows, within [64, 256].

    Example:
    >>> loop_rows(8192, 8), loop_rows(8192, 32), loop_rows(8192, 128)
    (256, 128, 64)
    """
    half = max(int(num_rows) // max(int(num_groups), 1) // 2, 1)
    return min(256, max(64, 1 << (half.bit_length() - 1)))


def _loop_steps(group_sizes, num_rows, m):
    """Per step of the looped kernel (`ceil(num_rows / m) + E` of them, enough for any
    group sizes): its group, its first row and its number of rows (0 past the last
    group), and how many steps are used."""
    import jax.numpy as jnp

    sizes = jnp.asarray(group_sizes).astype(jnp.int32)
    steps_per_group = -(-sizes // m)
    last_step = jnp.cumsum(steps_per_group)
    step = jnp.arange(-(-num_rows // m) + sizes.shape[0], dtype=jnp.int32)
    group = jnp.minimum(jnp.searchsorted(last_step, step, side="right"), sizes.shape[0] - 1)
    within = step - (last_step[group] - steps_per_group[group])
    first = jnp.cumsum(sizes)[group] - sizes[group] + within * m
    count = jnp.where(step < last_step[-1], jnp.clip(sizes[group] - within * m, 0, m), 0)
    return group, first, count, last_step[-1]


def _with_spare_rows(a, m):
    """`a` `[N, c]` and m rows of 0 after it, so that a step's m-row slice never runs off."""
    import jax.numpy as jnp

    return jnp.concatenate([a, jnp.zeros((m, a.shape[1]), a.dtype)])


def _loop_project(x, w, group_sizes, m, transpose):
    """`y[rows of g] = x[rows of g] @ w[g]` (`w[g].T` with `transpose`), m rows a step:
    a loop over the used steps only, each a dynamic slice of the rows and of one matrix."""
    import jax
    import jax.numpy as jnp

    num_rows, k = x.shape
    n = w.shape[1] if transpose else w.shape[2]
    group, first, count, used = _loop_steps(group_sizes, num_rows, m)
    padded = _with_spare_rows(x, m)
    keep_rows = jnp.arange(m)[:, None]

    def step(i, y):
        rows = jax.lax.dynamic_slice(padded, (first[i], 0), (m, k))
        matrix = jax.lax.dynamic_index_in_dim(w, group[i], keepdims=False)
        out = rows @ (matrix.T if transpose else matrix)
        old = jax.lax.dynamic_slice(y, (first[i], 0), (m, n))  # the next group's rows
        return jax.lax.dynamic_update_slice(
            y, jnp.where(keep_rows < count[i], out, old), (first[i], 0)
        )

    y = jax.lax.fori_loop(0, used, step, jnp.zeros((num_rows + m, n), x.dtype))
    return y[:num_rows]


def _loop_weight_gradient(x, dy, group_sizes, m, num_groups):
    """`dw[g] = x[rows of g].T @ dy[rows of g]`, accumulated in float32 m rows a step."""
    import jax
    import jax.numpy as jnp

    (num_rows, k), n = x.shape, dy.shape[1]
    group, first, count, used = _loop_steps(group_sizes, num_rows, m)
    padded_x, padded_dy = _with_spare_rows(x, m), _with_spare_rows(dy, m)
    keep_rows = jnp.arange(m)[:, None]

    def step(i, dw):
        rows = jax.lax.dynamic_slice(padded_x, (first[i], 0), (m, k))
        rows = jnp.where(keep_rows < count[i], rows, jnp.zeros_like(rows))
        grads = jax.lax.dynamic_slice(padded_dy, (first[i], 0), (m, n))
        part = jnp.matmul(rows.T, grads, preferred_element_type=jnp.float32)
        current = jax.lax.dynamic_index_in_dim(dw, group[i], keepdims=False)
        return jax.lax.dynamic_update_index_in_dim(dw, current + part, group[i], 0)

    dw = jax.lax.fori_loop(0, used, step, jnp.zeros((num_groups, k, n), jnp.float32))
    return dw.astype(x.dtype)


def _looped_grouped_matmul(x, w, group_sizes, m):
    import jax

    @jax.custom_vjp
    def looped(x, w, group_sizes):
        return _loop_project(x, w, group_sizes, m, transpose=False)

    def forward(x, w, group_sizes):
        return looped(x, w, group_sizes), (x, w, group_sizes)

    def backward(saved, dy):
        x, w, group_sizes = saved
        dx = _loop_project(dy, w, group_sizes, m, transpose=True)
        return dx, _loop_weight_gradient(x, dy, group_sizes, m, w.shape[0]), None

    looped.defvjp(forward, backward)
    return looped(x, w, ops.cast(group_sizes, "int32"))
