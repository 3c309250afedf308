"""Dropless experts sharded over a JAX mesh: rows travel to the chips that hold their experts.

With the experts' weights split over the mesh's `expert` axis, each device
sorts its own token-expert assignments by expert, sends each peer on its
expert axis the rows of the peer's experts, multiplies the rows it receives
by its own experts only (a grouped matmul over its `E / P` experts), and
sends the results back the same way; no expert weight moves. A histogram
(how many rows each device sends each peer, per expert) is exchanged first,
so both sides know the sizes.

The row exchange, per platform:
- TPU: `jax.lax.ragged_all_to_all`: each device's chunk of rows lands in the
  peer's receive buffer where the peer said (senders' chunks one after the
  other, in sender order); only the routed rows move.
- elsewhere (XLA:CPU does not implement ragged-all-to-all): the same result
  from one `jax.lax.all_to_all` of blocks padded to the worst case (all of a
  device's rows to one peer), for testing on emulated devices.

By default the receive buffer holds the worst case, `P` times a device's
`A` assignments, so nothing is ever dropped; the grouped matmul runs over the
whole buffer (rows past the received ones give 0) and the compiler counts its
FLOPs by the buffer's rows. `MoeLayer(dropless_buffer_factor=f)` sizes it
`ceil(f * A)` rows instead (MaxText's ragged buffer factor): a receiver takes
its senders' rows in sender order until it is full, and the rows that find no
room are dropped like over-capacity tokens (output 0; the layer's
`dropped_fraction` counts them). docs/dropless.md has the measurements.

Needs the JAX backend, a mesh from `keras_moe.parallel.sharding.configure_mesh` with
an `expert` axis of size > 1 dividing the expert count, groups the mesh
splits over its token axes (`token_exchange.exchange_plan`), and no expert
dropout in training. `plan` says why when it cannot run; the dropless
dispatcher then keeps the gathered-weights path.

Example (without a mesh there is nothing to plan):
>>> plan(num_experts=8, num_groups=4)[0] is None
True
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from keras import ops

from keras_moe.dispatch import grouped_matmul as grouped_matmul_lib
from keras_moe.parallel import sharding, token_exchange
from keras_moe.tensor_types import Tensor

if TYPE_CHECKING:
    from keras_moe.layers.experts import FeedForwardExperts
    from keras_moe.routing import RoutingInstructions

# `(jax mesh, token axes)` of an expert-parallel dropless layer.
DroplessLayout = tuple[Any, tuple[str, ...]]


def plan(num_experts: int, num_groups: int | None) -> tuple[DroplessLayout | None, str | None]:
    """`(jax mesh, token axes)` for an expert-parallel dropless layer, or `(None, reason)`.

    Args:
        num_experts: E.
        num_groups: G, the routing groups of the call (split over the token axes).
    """
    layout, reason = token_exchange.exchange_plan((num_experts, num_groups, 1, 1))
    if layout is None:
        return None, reason
    mesh, token_axes, _ = layout
    return (mesh, token_axes), None


def buffer_rows(assignments: int, peers: int, buffer_factor: float | None) -> int:
    """Rows of a device's receive buffer: the worst case `peers * assignments` (every peer
    sends all its rows here), or `ceil(buffer_factor * assignments)` rows, at most that.

    Example:
    >>> buffer_rows(100, 8, None), buffer_rows(100, 8, 1.25), buffer_rows(100, 8, 20.0)
    (800, 125, 800)
    """
    worst = peers * assignments
    if buffer_factor is None:
        return worst
    return min(worst, math.ceil(buffer_factor * assignments))


def _block_rows(rows, starts, sizes, block):
    """[P, block, d]: block p holds `rows[starts[p] : starts[p] + sizes[p]]`, zeros after."""
    import jax.numpy as jnp

    index = starts[:, None] + jnp.arange(block)[None, :]
    valid = jnp.arange(block)[None, :] < sizes[:, None]
    return jnp.where(valid[..., None], rows[jnp.clip(index, 0, rows.shape[0] - 1)], 0)


def _locate(starts, sizes, count):
    """For rows 0..count-1 laid out as consecutive runs (run p: `sizes[p]` rows from
    `starts[p]`): each row's run, its index in the run, and whether it is in one."""
    import jax.numpy as jnp

    runs = sizes.shape[0]
    r = jnp.arange(count)
    run = jnp.searchsorted(jnp.cumsum(sizes), r, side="right")
    inside = run < runs
    run = jnp.minimum(run, runs - 1)
    return run, r - starts[run], inside


def _to_peers(rows, route, buffer):
    """My rows (sorted by peer) into the peers' receive buffers; mine `[buffer, d]`, rows
    from peer s at `route["accept_offsets"][s]`, `route["accepted"][s]` of them."""
    import jax
    import jax.numpy as jnp

    if sharding.accelerator_platform() == "tpu":
        out = jnp.zeros((buffer, rows.shape[-1]), rows.dtype)
        return jax.lax.ragged_all_to_all(
            rows,
            out,
            route["offsets"],
            route["send"],
            route["land_offsets"],
            route["accepted"],
            axis_name="expert",
        )
    # XLA:CPU has no ragged all-to-all: worst-case blocks, one all_to_all, then compaction.
    block = rows.shape[0]
    moved = jax.lax.all_to_all(
        _block_rows(rows, route["offsets"], route["send"], block), "expert", 0, 0, tiled=True
    )
    source, index, inside = _locate(route["accept_offsets"], route["accepted"], buffer)
    picked = moved[source, jnp.clip(index, 0, block - 1)]
    return jnp.where(inside[:, None], picked, 0)


def _from_peers(results, route, num_rows):
    """Inverse of `_to_peers`: each result row back to the device (and row) it came from;
    rows that found no room come back 0."""
    import jax
    import jax.numpy as jnp

    if sharding.accelerator_platform() == "tpu":
        out = jnp.zeros((num_rows, results.shape[-1]), results.dtype)
        return jax.lax.ragged_all_to_all(
            results,
            out,
            route["accept_offsets"],
            route["accepted"],
            route["their_offsets"],
            route["send"],
            axis_name="expert",
        )
    blocks = _block_rows(results, route["accept_offsets"], route["accepted"], num_rows)
    moved = jax.lax.all_to_all(blocks, "expert", 0, 0, tiled=True)
    peer, index, inside = _locate(route["offsets"], route["want"], num_rows)
    inside = inside & (index < route["send"][peer])
    return jnp.where(inside[:, None], moved[peer, jnp.clip(index, 0, num_rows - 1)], 0)


def _route(counts, buffer):
    """Sizes and offsets of both exchanges from my rows per (peer, local expert) `counts`.

    Each receiver takes its senders' rows in sender order until its buffer is full."""
    import jax
    import jax.numpy as jnp

    want = counts.sum(axis=1)  # rows I would send each peer
    offsets = jnp.cumsum(want) - want  # where they start in my sorted rows
    recv_counts = jax.lax.all_to_all(counts, "expert", 0, 0, tiled=True)  # [P, E_local]
    offered = recv_counts.sum(axis=1)
    accepted = jnp.clip(buffer - (jnp.cumsum(offered) - offered), 0, offered)
    accept_offsets = jnp.cumsum(accepted) - accepted
    mine = jnp.stack([accepted, accept_offsets], axis=1)
    told = jax.lax.all_to_all(mine, "expert", 0, 0, tiled=True)  # what each peer took of mine
    their_offsets = jax.lax.all_to_all(offsets[:, None], "expert", 0, 0, tiled=True)[:, 0]
    return {
        "want": want,
        "offsets": offsets,
        "recv_counts": recv_counts,
        "accepted": accepted,
        "accept_offsets": accept_offsets,
        "send": told[:, 0],
        "land_offsets": told[:, 1],
        "their_offsets": their_offsets,
    }


def apply(
    x: Tensor,
    routing: RoutingInstructions,
    experts: FeedForwardExperts,
    layout: DroplessLayout,
    training: bool | None = None,
    buffer_factor: float | None = None,
) -> tuple[Tensor, Tensor]:
    """The dropless layer's outputs `[G, S, d]`, experts computed where they live.

    Args:
        x: group tokens `[G, S, d]`.
        routing: the router's `RoutingInstructions`.
        experts: a `FeedForwardExperts` whose weights are split over `expert`.
        layout: `plan`'s `(jax mesh, token axes)`.
        training: whether the layer is training (expert dropout is refused).
        buffer_factor: the receive buffer in multiples of a device's own
            assignments (`buffer_rows`); None: the worst case, nothing dropped.

    Returns:
        `(outputs [G, S, d], kept [G, S, K])`: `kept` is the routing's, less
        the assignments that found no room in their expert's device's buffer
        (their combine weight counts for nothing: output 0, as a dropped token).
    """
    import jax
    import jax.numpy as jnp
    from jax.sharding import PartitionSpec as P

    if training and experts.dropout_rate > 0:
        raise ValueError(
            "dispatch='dropless' with experts sharded over the mesh's 'expert' axis does not "
            f"apply expert dropout (dropout_rate={experts.dropout_rate}); set the experts' "
            "dropout_rate to 0, or use dispatch='einsum'."
        )
    mesh, token_axes = layout
    num_experts = routing.num_experts
    peers = dict(zip(mesh.axis_names, mesh.devices.shape, strict=False))["expert"]
    local_experts = num_experts // peers
    kernels = list(experts.trainable_variables)
    token_spec = P(token_axes if len(token_axes) > 1 else token_axes[0])

    def local(x, expert_index, kept, combine_weight, *kernel_values):
        groups, length, d = x.shape
        choices = expert_index.shape[-1]
        expert = jnp.where(kept > 0, expert_index, num_experts).reshape(-1)  # [A]
        assignments = expert.shape[0]
        buffer = buffer_rows(assignments, peers, buffer_factor)
        order = jnp.argsort(expert, stable=True)
        rows = x.reshape(groups * length, d)[order // choices]
        counts = jnp.bincount(expert, length=num_experts + 1)[:num_experts].astype(jnp.int32)
        route = _route(counts.reshape(peers, local_experts), buffer)
        received = _to_peers(rows, route, buffer)
        # Each received row's local expert: runs by sender, sorted by expert inside.
        source, index, inside = _locate(route["accept_offsets"], route["accepted"], buffer)
        ends = jnp.cumsum(route["recv_counts"], axis=1)[source]  # [B, E_local]
        row_expert = jnp.where(inside, jnp.sum(index[:, None] >= ends, axis=1), local_experts)
        by_expert = jnp.argsort(row_expert, stable=True)
        sizes = jnp.bincount(row_expert, length=local_experts + 1)[:local_experts]
        weights = dict(zip((id(v) for v in kernels), kernel_values, strict=False))

        def project(a, w):
            return grouped_matmul_lib.grouped_matmul(a, w, sizes, per_device=True)

        sorted_expert = row_expert[by_expert]

        def add_bias(y, b):  # each row its local expert's bias; rows past the sizes none
            valid = (sorted_expert < local_experts)[:, None]
            return y + jnp.where(valid, b[jnp.minimum(sorted_expert, local_experts - 1)], 0)

        computed = experts.feed_forward(
            received[by_expert],
            project,
            training,
            kernel=lambda variable: weights[id(variable)],
            add_bias=add_bias,
        )
        returned = _from_peers(computed[jnp.argsort(by_expert)], route, assignments)
        peer, index, inside = _locate(route["offsets"], route["want"], assignments)
        taken = (inside & (index < route["send"][peer])).astype(kept.dtype)
        undo = jnp.argsort(order)
        outputs = returned[undo].reshape(groups * length, choices, d)
        weight = combine_weight.reshape(groups * length, choices, 1).astype(outputs.dtype)
        y = jnp.sum(outputs * weight, axis=1).reshape(groups, length, d)
        return y, kept * taken[undo].reshape(kept.shape)

    values = [ops.cast(v.value, x.dtype) for v in kernels]
    run = jax.shard_map(
        local,
        mesh=mesh,
        in_specs=(token_spec, token_spec, token_spec, token_spec, *[P("expert")] * len(values)),
        out_specs=(token_spec, token_spec),
        check_vma=False,
    )
    token_exchange.note_choice(
        "ragged_all_to_all" if sharding.accelerator_platform() == "tpu" else "all_to_all",
        "dispatch='dropless' with experts split over 'expert': each device's rows go to the "
        "devices holding their experts and come back (no expert weight is gathered)",
    )
    return run(x, routing.expert_index, routing.kept, routing.combine_weight, *values)
