"""Grouped matmul: rows sorted by group, each group multiplied by its own matrix.

`grouped_matmul(x, w, group_sizes)` with `x` `[N, k]`, `w` `[E, k, n]` and
int `group_sizes` `[E]` returns `y` `[N, n]`: the first `group_sizes[0]` rows
times `w[0]`, the next `group_sizes[1]` rows times `w[1]`, and so on; rows
past `sum(group_sizes)` give 0. It is the dropless dispatcher's expert
computation: every expert multiplies exactly the tokens routed to it.

No `keras.ops` function does this, so it is written per backend (see
docs/dropless.md):

- TensorFlow: the rows are split at the group sizes (known at run time) and
  each group meets its matrix in one matmul. The expert axis of `w` is
  unstacked in one op, so its gradient is one stack (slicing `w[e]` E times
  would give E full-size gradients). Shapes are dynamic: graph and eager
  mode, not XLA (`jit_compile=True` raises, naming the alternative).
- JAX on CPU, small matrices (`kernel="tiled"`): each group's rows are padded
  to whole tiles of `m` rows (`tile_rows`: about a quarter of a group's
  average, a power of 2 in [8, 512]), each tile takes its group's matrix (a
  gather of `[tiles, k, n]`) and the tiles are multiplied as one batched
  matmul: the work of `N + E * m` rows, for a static number of tiles
  `ceil(N / m) + E`.
- JAX on CPU, large matrices (`kernel="looped"`, where the tiled kernel's
  copies of the matrices would pass `TILED_COPY_BYTES`): a loop over the used
  steps of `m` rows of one group (`loop_rows`: half a group's average, in [64,
  256]), each multiplying a dynamic slice of the rows by its group's matrix in
  place; no copy of the matrices, and the work of the rows plus less than `m`
  per group. Its gradient is two such loops (rows by the transposed matrices;
  each step's `x.T @ dy` added to its group's float32 weight gradient).
- JAX on GPU (`kernel="ragged_dot"`): `jax.lax.ragged_dot`, XLA's grouped
  matmul. On CPU XLA computes it as one dense matmul per group over all rows
  (7-100x one dense matmul at E = 8-128, measured), which "tiled" avoids.
- JAX on TPU (`kernel="megablox"`): the Pallas grouped matmul of
  `jax.experimental.pallas.ops.tpu.megablox` (`gmm`, with its own gradient:
  `gmm` for x, `tgmm` for w). Not `ragged_dot`: the TPU compiler expands the
  weight gradient of `ragged_dot` densely over the groups. For x `[4096, 768]`,
  w `[128, 768, 3072]` (bf16, one v5e chip) `ragged_dot` costs 1.93e10 FLOPs
  forward (2Nkn) but 2.5e12 forward + backward (130x the forward, 43x the
  3 x 2Nkn = 5.8e10 of a dense layer); megablox costs 5.8e10. Its price: an m-tile (<= 128 rows)
  that straddles a group boundary is computed once per group in it, so at most
  `N / tm + E - 1` tiles are computed instead of `N / tm`. Rows are padded to
  a multiple of the tile; under a device mesh the rows are split evenly over
  all devices (each computes its rows, group sizes cut to its slice) and the
  weights are replicated inside the kernel: experts sharded over an "expert"
  axis are gathered for the step (see docs/dropless.md).
"""

from __future__ import annotations

from typing import Any, Literal, NamedTuple

import keras
import numpy as np
from keras import ops

from keras_moe import compat
from keras_moe.dispatch.grouped_matmul_looped import _looped_grouped_matmul, loop_rows
from keras_moe.parallel import sharding
from keras_moe.tensor_types import Tensor

KERNELS = ("auto", "tiled", "looped", "ragged_dot", "megablox")
Kernel = Literal["auto", "tiled", "looped", "ragged_dot", "megablox"]
# The m tile (rows per kernel step) at most: the TPU's MXU is 128 wide.
MAX_ROW_TILE = 128
# What kernel="auto" runs on JAX, by platform ("cpu": `cpu_kernel` picks by size).
AUTO_KERNELS: dict[str, Kernel] = {"tpu": "megablox", "cpu": "tiled", "gpu": "ragged_dot"}
# The "tiled" kernel copies its group's matrix for every tile: above this many bytes of
# copies, "auto" runs "looped" on a CPU instead (benchmarks/grouped_matmul_speed.py: at N
# 8192, k 512, n 2048 and E 8 / 32 / 128 the copies are 0.16 / 0.5 / 2.7 GB and "looped" is
# 1.4 / 1.7 / 2.5x faster).
TILED_COPY_BYTES = 32 * 2**20


def grouped_matmul(
    x: Tensor,
    w: Tensor,
    group_sizes: Tensor,
    kernel: Kernel = "auto",
    interpret: bool = False,
    per_device: bool = False,
) -> Tensor:
    """Rows of `x`, sorted by group, times their group's matrix in `w`.

    Args:
        x: `[N, k]` rows, group 0's first.
        w: `[E, k, n]` one matrix per group.
        group_sizes: int `[E]`, rows per group, summing to at most N.
        kernel: JAX only: "auto" (megablox on TPU, tiled or looped on CPU by
            `cpu_kernel`, ragged_dot on GPU; the platform is
            `sharding.accelerator_platform()`), "tiled", "looped", "ragged_dot"
            or "megablox". The TensorFlow backend accepts "auto" only.
        interpret: with the megablox kernel, run the Pallas kernel in the
            interpreter (any platform, slow: for tests on CPU).
        per_device: `x` and `w` are one device's blocks (inside
            `jax.shard_map`): the megablox kernel runs on them as they are
            instead of slicing the rows over the configured mesh.

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
    if kernel not in KERNELS:
        raise ValueError(f"`kernel` must be one of {KERNELS}, got {kernel!r}.")
    if backend == "tensorflow" and kernel != "auto":
        raise ValueError(
            f"`kernel`={kernel!r} is a JAX kernel; the tensorflow backend "
            "takes kernel='auto' (tf.split + matmul)."
        )
    x = ops.convert_to_tensor(x)
    w = ops.cast(w, x.dtype)  # a variable's (autocast) value, in the rows' dtype
    if backend == "tensorflow":
        return _tensorflow_grouped_matmul(x, w, group_sizes)
    if backend == "jax":
        if kernel == "auto":
            kernel = AUTO_KERNELS[sharding.accelerator_platform()]
            if kernel == "tiled":
                kernel = cpu_kernel(x.shape[0], w.shape, x.dtype)
        if kernel == "megablox":
            return _megablox_grouped_matmul(
                x, w, group_sizes, interpret=interpret, per_device=per_device
            )
        if kernel == "tiled":
            return _tiled_grouped_matmul(x, w, group_sizes)
        if kernel == "looped":
            return _looped_grouped_matmul(x, w, group_sizes, loop_rows(x.shape[0], w.shape[0]))
        return _jax_grouped_matmul(x, w, group_sizes)
    raise NotImplementedError(
        f"dispatch='dropless' runs on the tensorflow and jax backends, not {backend!r}; "
        "use dispatch='gather'."
    )


def _tensorflow_grouped_matmul(x, w, group_sizes):
    import tensorflow as tf

    num_groups = w.shape[0]
    parts, rest = split_rows(x, group_sizes, num_groups)
    matrices = tf.unstack(w, num=num_groups)
    return join_rows([tf.matmul(rows, m) for rows, m in zip(parts, matrices, strict=True)], rest)


def split_rows(x: Tensor, group_sizes: Tensor, num_groups: int) -> tuple[list[Tensor], Tensor]:
    """TensorFlow: `(parts, rest)`, the rows of each group of `x` (sorted by group) and
    the number of rows past `sum(group_sizes)`; `join_rows` puts outputs back."""
    import tensorflow as tf

    if compat.tf_in_xla_context():
        raise ValueError(
            "dispatch='dropless' gives each expert as many tokens as were routed to it, "
            "which XLA cannot compile (it needs static shapes): compile without "
            "jit_compile=True, or use dispatch='gather' (or 'einsum') with a capacity factor."
        )
    sizes = tf.cast(group_sizes, "int32")
    rest = tf.shape(x)[0] - tf.reduce_sum(sizes)
    parts = tf.split(x, tf.concat([sizes, rest[None]], axis=0), num=num_groups + 1)
    return parts[:-1], rest


def join_rows(outputs: list[Tensor], rest: Tensor) -> Tensor:
    """TensorFlow: the groups' `outputs` in order, then `rest` rows of 0."""
    import tensorflow as tf

    zeros = tf.zeros(tf.stack([rest, tf.shape(outputs[0])[-1]]), dtype=outputs[0].dtype)
    return tf.concat([*outputs, zeros], axis=0)


def _jax_grouped_matmul(x, w, group_sizes):
    import jax

    sizes = ops.cast(group_sizes, "int32")
    y = jax.lax.ragged_dot(x, w, sizes)
    # Rows past the groups: zero them here rather than rely on the primitive.
    inside = ops.arange(ops.shape(x)[0]) < ops.sum(sizes)
    return ops.where(inside[:, None], y, ops.zeros_like(y))


def runs_tiled(num_rows: int, w_shape: tuple[int, ...], dtype: Any) -> bool:
    """Whether `grouped_matmul(kernel="auto")` runs the tiled kernel here (JAX on a CPU)
    for `num_rows` rows and matrices of `w_shape` `[E, k, n]`."""
    return (
        keras.backend.backend() == "jax"
        and AUTO_KERNELS[sharding.accelerator_platform()] == "tiled"
        and cpu_kernel(num_rows, w_shape, dtype) == "tiled"
    )


def cpu_kernel(num_rows: int, w_shape: tuple[int, ...], dtype: Any) -> Kernel:
    """The JAX/CPU kernel for `num_rows` rows and matrices `[E, k, n]`: "tiled" while its
    copies of the matrices (one per tile) stay within `TILED_COPY_BYTES`, else "looped".

    Example:
    >>> cpu_kernel(1024, (64, 128, 64), "float32"), cpu_kernel(8192, (8, 512, 2048), "float32")
    ('tiled', 'looped')
    """

    num_groups, k, n = (int(d) for d in w_shape)
    tiles = -(-int(num_rows) // tile_rows(num_rows, num_groups)) + num_groups
    copies = tiles * k * n * np.dtype(keras.backend.standardize_dtype(dtype)).itemsize
    return "tiled" if copies <= TILED_COPY_BYTES else "looped"


def row_groups(
    group_sizes: Tensor, num_rows: int | Tensor, num_groups: int
) -> tuple[Tensor, Tensor]:
    """`(group, inside)` of each of `num_rows` rows sorted by group: its group (the
    last one for rows past `sum(group_sizes)`) and whether it is within the groups.

    Example:
    >>> import numpy as np
    >>> group, inside = row_groups(np.array([2, 0, 1]), 4, 3)
    >>> np.asarray(group).tolist(), np.asarray(inside).tolist()
    ([0, 0, 2, 2], [True, True, True, False])
    """
    ends = ops.cumsum(ops.cast(group_sizes, "int32"))
    group = ops.searchsorted(ends, ops.arange(num_rows, dtype="int32"), side="right")
    return ops.minimum(group, num_groups - 1), group < num_groups


def tile_rows(num_rows: int, num_groups: int) -> int:
    """Rows per tile of the "tiled" kernel: the largest power of 2 at most a quarter
    of a group's average rows, within [8, 512] (a tile wastes at most m - 1 rows
    per group: about an eighth of the work on average).

    Example:
    >>> tile_rows(16384, 64), tile_rows(4096, 8), tile_rows(10, 4)
    (64, 128, 8)
    """
    quarter = max(int(num_rows) // max(int(num_groups), 1) // 4, 8)
    return min(512, 1 << (quarter.bit_length() - 1))


class Tiles(NamedTuple):
    """Rows sorted by group, laid out as whole tiles per group (`to_tiles`).

    rows: `[T, m, k]`, each tile's rows (zeros where a tile is not full).
    group: int `[T]`, each tile's group (tiles past the last group: the last).
    slot: int `[N]`, each row's place in `rows` flattened (out of range: past the groups).
    inside: bool `[N]`, the rows within `sum(group_sizes)`.
    """

    rows: Any
    group: Any
    slot: Any
    inside: Any


def to_tiles(x: Tensor, group_sizes: Tensor, num_groups: int) -> Tiles:
    """JAX: the rows of `x` `[N, k]` (sorted by group) in tiles of `tile_rows(N, E)` rows
    that each hold one group's rows; `from_tiles` undoes it.

    Example:
    >>> import numpy as np
    >>> tiles = to_tiles(np.ones((10, 2), "float32"), np.array([9, 0, 1]), 3)
    >>> tuple(tiles.rows.shape), np.asarray(tiles.group).tolist()[:3]
    ((5, 8, 2), [0, 0, 2])
    """
    import jax.numpy as jnp

    x = jnp.asarray(x)
    num_rows, k = x.shape
    m = tile_rows(num_rows, num_groups)
    num_tiles = -(-num_rows // m) + num_groups  # enough for any group sizes
    sizes = jnp.asarray(group_sizes).astype(jnp.int32)
    padded_sizes = -(-sizes // m) * m
    ends, padded_ends = jnp.cumsum(sizes), jnp.cumsum(padded_sizes)
    group, inside = (jnp.asarray(a) for a in row_groups(sizes, num_rows, num_groups))
    row = jnp.arange(num_rows, dtype=jnp.int32)
    slot = padded_ends[group] - padded_sizes[group] + row - (ends[group] - sizes[group])
    slot = jnp.where(inside, slot, num_tiles * m)  # out of range: dropped
    rows = jnp.zeros((num_tiles * m, k), x.dtype).at[slot].set(x, mode="drop")
    tile_group = jnp.searchsorted(padded_ends, jnp.arange(num_tiles) * m, side="right")
    return Tiles(
        rows.reshape(num_tiles, m, k), jnp.minimum(tile_group, num_groups - 1), slot, inside
    )


def tiles_matmul(rows: Tensor, w: Tensor, tile_group: Tensor) -> Tensor:
    """`[T, m, k]` tiles times their group's matrix of `w` `[E, k, n]` -> `[T, m, n]`."""
    import jax.numpy as jnp

    w = ops.cast(w, rows.dtype)  # a variable's (autocast) value, in the rows' dtype
    return jnp.einsum("tmk,tkn->tmn", rows, jnp.take(w, tile_group, axis=0))


def from_tiles(y: Tensor, tiles: Tiles) -> Tensor:
    """`[T, m, n]` outputs of `tiles` -> `[N, n]` in the rows' order (0 past the groups)."""
    import jax.numpy as jnp

    flat = y.reshape(-1, y.shape[-1])
    out = flat[jnp.minimum(tiles.slot, flat.shape[0] - 1)]
    return jnp.where(tiles.inside[:, None], out, jnp.zeros_like(out))


def _tiled_grouped_matmul(x, w, group_sizes):
    tiles = to_tiles(x, group_sizes, w.shape[0])
    return from_tiles(tiles_matmul(tiles.rows, w, tiles.group), tiles)


def _round_up(value, multiple):
    return -(-value // multiple) * multiple


def megablox_tiling(rows: int, k: int, n: int) -> tuple[int, int, int]:
    """The (tm, tk, tn) tiles of the megablox kernel for `rows` rows (per device).

    tm: 128 rows, or all rows (rounded up to 16, bf16's sublane tile) when
    fewer: a smaller tile wastes less where a tile straddles a group boundary
    but leaves the 128-wide MXU partly idle. tk = tn: the largest of
    512/256/128 that divides both k and n (the backward pass swaps their roles,
    so one size serves both), else 128 (the kernel masks the ragged edge).

    Example:
    >>> megablox_tiling(4096, 768, 3072)
    (128, 256, 256)
    >>> megablox_tiling(40, 64, 128)
    (48, 128, 128)
    """
    tm = min(MAX_ROW_TILE, _round_up(max(int(rows), 1), 16))
    tile = next((t for t in (512, 256, 128) if k % t == 0 and n % t == 0), 128)
    return tm, tile, tile


def _megablox_grouped_matmul(x, w, group_sizes, interpret=False, per_device=False):
    import jax
    import jax.numpy as jnp
    from jax.experimental.pallas.ops.tpu.megablox import gmm
    from jax.sharding import PartitionSpec

    if x.dtype not in (jnp.float32, jnp.bfloat16):
        raise ValueError(
            f"the megablox kernel takes float32 or bfloat16 rows `x`, "
            f"got {x.dtype}; cast them (or use kernel='ragged_dot')."
        )
    num_rows, k = x.shape
    n = w.shape[-1]
    sizes = jnp.asarray(group_sizes).astype(jnp.int32)
    mesh = None if per_device else _jax_mesh()
    shards = 1 if mesh is None else mesh.devices.size
    tm = megablox_tiling(-(-num_rows // shards), k, n)[0]
    local_rows = _round_up(-(-num_rows // shards), tm)
    padded = local_rows * shards
    tiling = megablox_tiling(local_rows, k, n)
    # Rows past sum(group_sizes) (and the padding) belong to no group: the
    # kernel leaves them unwritten, in its output and in the x gradient, so
    # both are masked (a select: garbage there never reaches a gradient).
    inside = jnp.arange(padded) < jnp.sum(sizes)
    rows = jnp.pad(x, ((0, padded - num_rows), (0, 0)))
    rows = jnp.where(inside[:, None], rows, jnp.zeros_like(rows))

    def local(rows, sizes, w):
        return gmm(rows, w, sizes, rows.dtype, tiling, None, None, False, interpret)

    if mesh is None:
        y = local(rows, sizes, w)
    else:
        # A Pallas call is not partitioned by GSPMD: each device multiplies a
        # slice of the rows with every expert's weights (gathered if sharded).
        # Sorted rows cut into equal contiguous slices stay sorted: slice s
        # holds, of group g, the rows of [start_g, end_g) within [s*L, (s+1)*L).
        ends = jnp.cumsum(sizes)
        lo = jnp.arange(shards, dtype=jnp.int32)[:, None] * local_rows
        local_sizes = jnp.clip(ends[None] - lo, 0, local_rows) - jnp.clip(
            (ends - sizes)[None] - lo, 0, local_rows
        )
        every = PartitionSpec(tuple(mesh.axis_names))
        y = jax.shard_map(
            lambda r, s, m: local(r, s[0], m),
            mesh=mesh,
            in_specs=(every, every, PartitionSpec()),
            out_specs=every,
            check_vma=False,
        )(rows, local_sizes.astype(jnp.int32), w)
    y = jnp.where(inside[:, None], y, jnp.zeros_like(y))
    return y[:num_rows]


def _jax_mesh():
    """The jax Mesh of the configured keras distribution, or None (one device)."""
    mesh = getattr(keras.distribution.distribution(), "device_mesh", None)
    if mesh is None or mesh.backend_mesh.devices.size == 1:
        return None
    return mesh.backend_mesh
