"""Dropless experts sharded over a JAX mesh: rows travel to the chips that hold their experts.

With the experts' weights split over the mesh's `expert` axis, each device
sorts its own token-expert assignments by expert, sends each peer on its
expert axis the rows of the peer's experts, multiplies the rows it receives
by its own experts only (a grouped matmul over its `E / P` experts), and
sends the results back the same way; no expert weight moves. A histogram
(how many rows each device sends each peer, per expert) is exchanged first,
so both sides know the sizes.

The row exchange, per platform:
- TPU: `jax.lax.ragged_all_to_all`: each chunk of rows lands in the peer's
  receive buffer at the block of its sender; only the routed rows move.
- elsewhere (XLA:CPU does not implement ragged-all-to-all): the same
  semantics as one `jax.lax.all_to_all` of buffers padded to the worst case
  (all of a device's rows to one peer), for testing on emulated devices.

The receive buffer holds the worst case, `P` blocks of a device's `A`
assignments each, so nothing is ever dropped; the grouped matmul runs over
that buffer with the received rows' group sizes (rows past them give 0), and
the compiler counts its FLOPs by the buffer's rows (docs/dropless.md).

Needs the JAX backend, a mesh from `keras_moe.sharding.configure_mesh` with
an `expert` axis of size > 1 dividing the expert count, groups the mesh
splits over its token axes (`token_exchange.exchange_plan`), and no expert
dropout in training. `plan` says why when it cannot run; the dropless
dispatcher then keeps the gathered-weights path.

Example (without a mesh there is nothing to plan):
>>> plan(num_experts=8, num_groups=4)[0] is None
True
"""

from keras import ops

from keras_moe import grouped_matmul as grouped_matmul_lib
from keras_moe import sharding, token_exchange


def plan(num_experts, num_groups):
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


def _exchange_rows(rows, offsets, send_sizes, recv_sizes, their_offsets, block, to_peers):
    """Rows to (or back from) the peers on the `expert` axis, in blocks of `block` rows.

    to_peers: `rows` [A, d] sorted by destination; peer p's rows start at
        `offsets[p]`, `send_sizes[p]` of them; returns [P * block, d], block s
        holding the `recv_sizes[s]` rows from peer s.
    back: `rows` [P * block, d] in that block layout; returns [A, d], each
        row back where it started (`their_offsets[s]`: where peer s's rows
        to me started in its sorted rows).
    """
    import jax
    import jax.numpy as jnp

    peers = send_sizes.shape[0]
    me = jax.lax.axis_index("expert")
    d = rows.shape[-1]
    if sharding.accelerator_platform() == "tpu":
        if to_peers:
            out = jnp.zeros((peers * block, d), rows.dtype)
            return jax.lax.ragged_all_to_all(
                rows, out, offsets, send_sizes, jnp.full((peers,), me * block, jnp.int32),
                recv_sizes, axis_name="expert")
        out = jnp.zeros((block, d), rows.dtype)
        return jax.lax.ragged_all_to_all(
            rows, out, jnp.arange(peers, dtype=jnp.int32) * block, recv_sizes, their_offsets,
            send_sizes, axis_name="expert")
    # Worst-case padded blocks and one all-to-all: the same result, dense.
    if to_peers:
        index = offsets[:, None] + jnp.arange(block)[None, :]  # [P, block]
        valid = jnp.arange(block)[None, :] < send_sizes[:, None]
        blocks = jnp.where(valid[..., None], rows[jnp.clip(index, 0, rows.shape[0] - 1)], 0)
        moved = jax.lax.all_to_all(blocks, "expert", 0, 0, tiled=True)
        return moved.reshape(peers * block, d)
    moved = jax.lax.all_to_all(rows.reshape(peers, block, d), "expert", 0, 0, tiled=True)
    # moved[p, i]: my i-th row sent to peer p, back; my sorted row r came from peer p.
    r = jnp.arange(block)
    ends = jnp.cumsum(send_sizes)
    peer = jnp.searchsorted(ends, r, side="right")
    inside = peer < peers
    peer = jnp.minimum(peer, peers - 1)
    back = moved[peer, jnp.clip(r - offsets[peer], 0, block - 1)]
    return jnp.where(inside[:, None], back, 0)


def apply(x, routing, experts, layout, training=None):
    """The dropless layer's outputs `[G, S, d]`, experts computed where they live.

    Args:
        x: group tokens `[G, S, d]`.
        routing: the router's `RoutingInstructions`.
        experts: a `FeedForwardExperts` whose weights are split over `expert`.
        layout: `plan`'s `(jax mesh, token axes)`.
        training: whether the layer is training (expert dropout is refused).
    """
    import jax
    import jax.numpy as jnp
    from jax.sharding import PartitionSpec as P

    if training and experts.dropout_rate > 0:
        raise ValueError(
            "dispatch='dropless' with experts sharded over the mesh's 'expert' axis does not "
            f"apply expert dropout (dropout_rate={experts.dropout_rate}); set the experts' "
            "dropout_rate to 0, or use dispatch='einsum'.")
    mesh, token_axes = layout
    num_experts = routing.num_experts
    peers = dict(zip(mesh.axis_names, mesh.devices.shape))["expert"]
    local_experts = num_experts // peers
    kernels = list(experts.trainable_variables)
    token_spec = P(token_axes if len(token_axes) > 1 else token_axes[0])
    expert_spec = P("expert")

    def local(x, expert_index, kept, combine_weight, *kernel_values):
        groups, length, d = x.shape
        choices = expert_index.shape[-1]
        tokens = x.reshape(groups * length, d)
        expert = jnp.where(kept > 0, expert_index, num_experts).reshape(-1)  # [A]
        assignments = expert.shape[0]
        order = jnp.argsort(expert, stable=True)
        rows = tokens[order // choices]
        counts = jnp.bincount(expert, length=num_experts + 1)[:num_experts].astype(jnp.int32)
        counts = counts.reshape(peers, local_experts)
        send_sizes = counts.sum(axis=1)
        offsets = jnp.cumsum(send_sizes) - send_sizes
        # The histogram first: what each peer sends me, per local expert.
        recv_counts = jax.lax.all_to_all(counts, "expert", 0, 0, tiled=True)
        recv_sizes = recv_counts.sum(axis=1)
        their_offsets = jax.lax.all_to_all(offsets[:, None], "expert", 0, 0, tiled=True)[:, 0]
        received = _exchange_rows(rows, offsets, send_sizes, recv_sizes, their_offsets,
                                  assignments, to_peers=True)
        # Each received row's local expert: blocks by sender, sorted by expert inside.
        position = jnp.arange(assignments)
        ends = jnp.cumsum(recv_counts, axis=1)  # [P, E_local]
        row_expert = jax.vmap(lambda e: jnp.searchsorted(e, position, side="right"))(ends)
        row_expert = row_expert.reshape(-1)  # local_experts where no row arrived
        by_expert = jnp.argsort(row_expert, stable=True)
        undo = jnp.argsort(by_expert)
        sizes = recv_counts.sum(axis=0)
        weights = dict(zip((id(v) for v in kernels), kernel_values))

        def project(a, w):
            return grouped_matmul_lib.grouped_matmul(a, w, sizes, per_device=True)

        computed = experts.feed_forward(received[by_expert], project, training,
                                        kernel=lambda variable: weights[id(variable)])
        returned = _exchange_rows(computed[undo], offsets, send_sizes, recv_sizes,
                                  their_offsets, assignments, to_peers=False)
        outputs = returned[jnp.argsort(order)].reshape(groups * length, choices, d)
        weight = combine_weight.reshape(groups * length, choices, 1).astype(outputs.dtype)
        return jnp.sum(outputs * weight, axis=1).reshape(groups, length, d)

    values = [ops.cast(v.value, x.dtype) for v in kernels]
    run = jax.shard_map(
        local, mesh=mesh,
        in_specs=(token_spec, token_spec, token_spec, token_spec, *[expert_spec] * len(values)),
        out_specs=token_spec, check_vma=False)
    token_exchange.note_choice(
        "ragged_all_to_all" if sharding.accelerator_platform() == "tpu" else "all_to_all",
        "dispatch='dropless' with experts split over 'expert': each device's rows go to the "
        "devices holding their experts and come back (no expert weight is gathered)")
    return run(x, routing.expert_index, routing.kept, routing.combine_weight, *values)
