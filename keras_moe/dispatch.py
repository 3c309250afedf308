"""Dispatch and combine: move tokens to expert buffers and expert outputs back.

Both dispatchers consume the same `RoutingInstructions` and give the same
numbers; they differ only in how they move data:

- `EinsumDispatcher` builds one-hot dispatch/combine tensors `[G, S, E, C]`
  and contracts them with einsums (GShard's formulation). Shapes are static,
  which is what TPUs want, and under a JAX mesh the buffers move between
  the token and expert layouts by two all-to-alls (`keras_moe.token_exchange`).
  Cost grows with `S * E * C`.
- `GatherDispatcher` computes, for every expert slot, which token fills it,
  then gathers tokens into slots and scatter-adds slot outputs back into
  tokens. Memory and time are O(tokens * d), which is what CPUs and GPUs want.
- `DroplessDispatcher` has no capacity and drops nothing: the token-expert
  assignments are sorted by expert and each expert multiplies exactly its
  tokens (`grouped_matmul`), as MegaBlocks does on GPUs. Group sizes depend
  on the routing: TensorFlow runs it with dynamic shapes (CPU/GPU, not XLA or
  TPU); JAX with static shapes and a grouped-matmul kernel (`ragged_dot` on
  CPU/GPU, the Pallas megablox kernel on TPU; docs/dropless.md).

Expert buffers are laid out `[E, G, C, d]` (experts first), so the experts'
batched matmul needs no transpose and the expert axis can be sharded.
`Dispatcher.apply` runs the whole path (dispatch, experts, combine).
"""

from typing import NamedTuple

import keras
from keras import ops

from keras_moe import dropless_exchange, sharding, token_exchange

DISPATCH_MODES = ("auto", "einsum", "gather", "dropless")


class EinsumPlan(NamedTuple):
    """What `EinsumDispatcher` derives from `RoutingInstructions`."""

    num_groups: object
    group_size: int
    num_experts: int
    capacity: int
    dispatch_tensor: object  # [G, S, E, C] 0/1
    combine_tensor: object  # [G, S, E, C] combine weights


class GatherPlan(NamedTuple):
    """What `GatherDispatcher` derives from `RoutingInstructions`."""

    num_groups: object
    group_size: object  # int, or a scalar tensor when known at run time only
    num_experts: int
    capacity: object  # int, or a scalar tensor (see RoutingInstructions)
    slot_token: object  # int32 [E*G*C]: token index, or G*S if the slot is empty
    slot_weight: object  # float32 [E*G*C]
    token_slot: object  # int32 [G*S, K]: slot index, or E*G*C if not kept
    token_weight: object  # float32 [G*S, K]


class Dispatcher:
    """Moves tokens into expert buffers `[E, G, C, d]` and expert outputs back.

    `plan(routing)` derives the per-call data once; `dispatch(x, plan)` maps
    group tokens `[G, S, d]` to expert buffers, `combine(expert_outputs, plan)`
    maps them back, weighted by the combine weights (0 for dropped tokens).
    """

    name = None
    drops_tokens = True  # False: no capacity, every assignment is computed

    def check(self, router, experts):
        """Raises ValueError, naming `dispatch`, when `router` or `experts` cannot be used."""

    def expert_capacity(self, router, group_size, capacity_factor, min_expert_capacity):
        """Slots per expert per group: the router's `expert_capacity` (see it)."""
        return router.expert_capacity(group_size, capacity_factor, min_expert_capacity)

    def apply_and_report(self, x, routing, experts, training=None):
        """`(apply(...), kept)`: the outputs and which assignments were computed
        (`routing.kept`, less any the dispatcher itself dropped)."""
        return self.apply(x, routing, experts, training), routing.kept

    def apply(self, x, routing, experts, training=None):
        """Outputs `[G, S, d]` of the `experts` layer for group tokens `x` routed by `routing`."""
        plan = self.plan(routing)
        expert_outputs = experts(self.dispatch(x, plan), training=training)
        return self.combine(expert_outputs, plan)

    def plan(self, routing):
        raise NotImplementedError

    def dispatch(self, x, plan):
        raise NotImplementedError

    def combine(self, expert_outputs, plan):
        raise NotImplementedError


class EinsumDispatcher(Dispatcher):
    """One-hot einsum dispatch (TPU / GSPMD friendly).

    Example:
    >>> import numpy as np
    >>> from keras_moe.routing import SwitchRouter
    >>> x = np.random.default_rng(0).normal(size=(2, 16, 8)).astype("float32")  # [G, S, d]
    >>> router = SwitchRouter(num_experts=4)
    >>> routing = router.route(router(x), np.ones((2, 16)), capacity=3)
    >>> dispatcher = EinsumDispatcher()
    >>> plan = dispatcher.plan(routing)
    >>> expert_inputs = dispatcher.dispatch(x, plan)
    >>> tuple(expert_inputs.shape)  # [E, G, C, d]
    (4, 2, 3, 8)
    >>> y = dispatcher.combine(expert_inputs, plan)  # identity experts
    >>> gate = np.sum(routing.combine_weight, axis=-1, keepdims=True)  # 0 if dropped
    >>> bool(np.allclose(y, x * gate, atol=1e-6))
    True
    """

    name = "einsum"

    def plan(self, routing):
        if not isinstance(routing.capacity, int):
            raise ValueError(
                "dispatch='einsum' needs a static expert capacity, but the routing group's "
                "size is only known at run time (group_size='batch' with an unknown batch "
                "size). Batch with a fixed size (drop_remainder=True), set `group_size` to "
                "'sequence' or an integer, or use dispatch='gather'.")
        shape = ops.shape(routing.expert_index)
        expert_hot = ops.one_hot(routing.expert_index, routing.num_experts, dtype="float32")
        slot_hot = ops.one_hot(routing.position, routing.capacity, dtype="float32")
        kept_expert = expert_hot * routing.kept[..., None]
        dispatch_tensor = ops.einsum("gske,gskc->gsec", kept_expert, slot_hot)
        weighted_expert = expert_hot * routing.combine_weight[..., None]
        combine_tensor = ops.einsum("gske,gskc->gsec", weighted_expert, slot_hot)
        return EinsumPlan(
            num_groups=shape[0],
            group_size=routing.expert_index.shape[1],
            num_experts=routing.num_experts,
            capacity=routing.capacity,
            dispatch_tensor=dispatch_tensor,
            combine_tensor=combine_tensor,
        )

    def dispatch(self, x, plan):
        dispatch_tensor = ops.cast(plan.dispatch_tensor, x.dtype)
        expert_inputs = ops.einsum("gsec,gsd->egcd", dispatch_tensor, x)
        return token_exchange.to_experts(expert_inputs)

    def combine(self, expert_outputs, plan):
        expert_outputs = token_exchange.from_experts(expert_outputs)
        combine_tensor = ops.cast(plan.combine_tensor, expert_outputs.dtype)
        y = ops.einsum("gsec,egcd->gsd", combine_tensor, expert_outputs)
        return sharding.with_logical_constraint(y, ("batch", "length", "embed"))


class GatherDispatcher(Dispatcher):
    """Gather/scatter dispatch by slot index (CPU / GPU friendly).

    Example:
    >>> import numpy as np
    >>> from keras_moe.routing import SwitchRouter
    >>> x = np.random.default_rng(0).normal(size=(2, 16, 8)).astype("float32")  # [G, S, d]
    >>> router = SwitchRouter(num_experts=4)
    >>> routing = router.route(router(x), np.ones((2, 16)), capacity=3)
    >>> plan = GatherDispatcher().plan(routing)
    >>> expert_inputs = GatherDispatcher().dispatch(x, plan)
    >>> tuple(expert_inputs.shape)  # [E, G, C, d]
    (4, 2, 3, 8)
    >>> einsum = EinsumDispatcher()  # same numbers as the einsum path
    >>> bool(np.allclose(expert_inputs, einsum.dispatch(x, einsum.plan(routing))))
    True
    """

    name = "gather"

    def plan(self, routing):
        shape = ops.shape(routing.expert_index)
        num_groups, group_size = shape[0], routing.expert_index.shape[1]
        if group_size is None:  # known at run time only ("batch" groups)
            group_size = shape[1]
        num_experts, capacity = routing.num_experts, routing.capacity
        num_slots = num_experts * num_groups * capacity
        kept = routing.kept > 0
        group_ids = ops.reshape(ops.arange(num_groups, dtype="int32"), (-1, 1, 1))
        token_ids = ops.reshape(ops.arange(group_size, dtype="int32"), (1, -1, 1))
        slot = (routing.expert_index * num_groups + group_ids) * capacity + routing.position
        # Dropped assignments write to one extra, discarded slot.
        slot = ops.where(kept, slot, num_slots)
        slot = ops.reshape(slot, (-1, 1))
        flat_token = ops.broadcast_to(group_ids * group_size + token_ids, ops.shape(routing.kept))
        # Store token index + 1 so that an empty slot reads 0 (scatter adds).
        token_plus_one = ops.where(kept, flat_token + 1, 0)
        slot_token = ops.scatter(slot, ops.reshape(token_plus_one, (-1,)), (num_slots + 1,))
        slot_token = slot_token[:num_slots] - 1
        num_tokens = num_groups * group_size
        slot_token = ops.where(slot_token < 0, num_tokens, slot_token)
        slot_weight = ops.scatter(
            slot, ops.reshape(routing.combine_weight, (-1,)), (num_slots + 1,)
        )[:num_slots]
        num_choices = routing.expert_index.shape[-1]
        return GatherPlan(
            num_groups=num_groups,
            group_size=group_size,
            num_experts=num_experts,
            capacity=capacity,
            slot_token=slot_token,
            slot_weight=slot_weight,
            token_slot=ops.reshape(slot, (-1, num_choices)),
            token_weight=ops.reshape(routing.combine_weight, (-1, num_choices)),
        )

    def dispatch(self, x, plan):
        d_model = x.shape[-1]
        tokens = ops.reshape(x, (-1, d_model))
        if _uses_gather_gradients(plan):
            expert_inputs = _gather_rows_with_gather_gradient(
                tokens, plan.slot_token, plan.token_slot)
        else:
            expert_inputs = ops.take(_with_zero_row(tokens), plan.slot_token, axis=0)
        expert_inputs = ops.reshape(
            expert_inputs, (plan.num_experts, plan.num_groups, plan.capacity, d_model)
        )
        token_exchange.note_choice(
            "gspmd", "dispatch='gather' fills expert slots by gather and scatter; the layout "
            "constraints leave their movement to GSPMD (dispatch='einsum' exchanges by "
            "all-to-all)", expert_inputs.shape)
        return sharding.with_logical_constraint(
            expert_inputs, ("expert", "batch", None, "embed")
        )

    def combine(self, expert_outputs, plan):
        d_model = expert_outputs.shape[-1]
        outputs = ops.reshape(expert_outputs, (-1, d_model))
        num_tokens = plan.num_groups * plan.group_size
        if _uses_gather_gradients(plan):
            y = _weighted_gather_with_gather_gradient(
                outputs, ops.cast(plan.token_weight, outputs.dtype), plan.token_slot,
                ops.cast(plan.slot_weight, outputs.dtype), plan.slot_token)
        else:
            weighted = outputs * ops.cast(plan.slot_weight, outputs.dtype)[:, None]
            y = ops.segment_sum(weighted, plan.slot_token, num_segments=num_tokens + 1)
            y = y[:num_tokens]
        y = ops.reshape(y, (plan.num_groups, plan.group_size, d_model))
        return sharding.with_logical_constraint(y, ("batch", "length", "embed"))


class DroplessDispatcher(Dispatcher):
    """Sorts the token-expert assignments by expert; each expert computes exactly its tokens.

    Needs a router whose tokens pick their experts (`picks_experts_per_token`)
    and an experts layer that takes sorted rows (`takes_sorted_rows`:
    `experts(rows, group_sizes=...)`, as `FeedForwardExperts`); `check` says
    so. Its `expert_capacity` is the group size, room for every assignment, so
    the router keeps each choice that asks for a slot. Padding and unused
    choices sort last and are not computed.

    Example:
    >>> import numpy as np
    >>> from keras_moe.experts import FeedForwardExperts
    >>> from keras_moe.routing import SwitchRouter
    >>> x = np.random.default_rng(0).normal(size=(2, 16, 8)).astype("float32")  # [G, S, d]
    >>> router, experts = SwitchRouter(num_experts=4), FeedForwardExperts(4, d_ff=16)
    >>> dropless = DroplessDispatcher()
    >>> dropless.check(router, experts)  # fine: no error
    >>> capacity = dropless.expert_capacity(router, 16, 1.0, 4)
    >>> capacity
    16
    >>> routing = router.route(router(x), np.ones((2, 16)), capacity=capacity)
    >>> y = dropless.apply(x, routing, experts)
    >>> bool(np.allclose(y, GatherDispatcher().apply(x, routing, experts), atol=1e-5))
    True
    """

    name = "dropless"
    drops_tokens = False

    def __init__(self, buffer_factor=None):
        if buffer_factor is not None and not (
                isinstance(buffer_factor, (int, float)) and buffer_factor > 0):
            raise ValueError(f"`dropless_buffer_factor` must be None or a number > 0, "
                             f"got {buffer_factor!r}.")
        self.buffer_factor = buffer_factor

    def check(self, router, experts):
        if not router.picks_experts_per_token:
            raise ValueError(
                "dispatch='dropless' has no capacity, so it needs a token-choice router "
                f"(Switch, top-2, top-k); got {type(router).__name__}.")
        if not experts.takes_sorted_rows:
            raise ValueError(
                f"dispatch='dropless' runs the experts on tokens sorted by expert, which "
                f"{type(experts).__name__} does not take (expert-parallel experts exchange "
                "fixed-capacity buffers); use dispatch='gather' or 'einsum' with it.")

    def expert_capacity(self, router, group_size, capacity_factor, min_expert_capacity):
        # A token takes at most one slot of an expert: a group's size is room for all.
        return group_size

    def apply_and_report(self, x, routing, experts, training=None):
        layout, reason = dropless_exchange.plan(routing.num_experts, x.shape[0])
        if layout is None:
            return self._gathered_weights(x, routing, experts, training, reason), routing.kept
        y, kept = dropless_exchange.apply(x, routing, experts, layout, training,
                                          self.buffer_factor)
        return sharding.with_logical_constraint(y, ("batch", "length", "embed")), kept

    def apply(self, x, routing, experts, training=None):
        return self.apply_and_report(x, routing, experts, training)[0]

    def _gathered_weights(self, x, routing, experts, training, reason):
        """Every device sorts its own rows; sharded experts' weights are gathered."""
        d_model = x.shape[-1]
        num_experts = routing.num_experts
        num_choices = routing.expert_index.shape[-1]
        # Assignment a = token * K + choice; unkept ones go to a last, uncomputed bucket.
        expert = ops.reshape(ops.where(routing.kept > 0, routing.expert_index, num_experts), (-1,))
        order = ops.cast(ops.argsort(expert), "int32")
        num_assignments = ops.shape(order)[0]
        inverse = ops.scatter(order[:, None], ops.arange(num_assignments, dtype="int32"),
                              (num_assignments,))  # the inverse permutation, without a sort
        group_sizes = ops.segment_sum(ops.ones_like(expert), expert,
                                      num_segments=num_experts + 1)[:num_experts]
        tokens = ops.reshape(x, (-1, 1, d_model))
        assignments = ops.reshape(
            ops.broadcast_to(tokens, (ops.shape(tokens)[0], num_choices, d_model)),
            (-1, d_model))
        rows = _permute_rows(assignments, order, inverse)
        token_exchange.note_choice(
            "gspmd", "dispatch='dropless' sorts each device's tokens by expert and the "
            f"experts' weights are gathered to every device ({reason})")
        outputs = experts(rows, group_sizes=group_sizes, training=training)
        outputs = ops.reshape(_permute_rows(outputs, inverse, order), (-1, num_choices, d_model))
        weight = ops.reshape(ops.cast(routing.combine_weight, outputs.dtype), (-1, num_choices, 1))
        y = ops.sum(outputs * weight, axis=1)
        y = ops.reshape(y, ops.shape(x))
        return sharding.with_logical_constraint(y, ("batch", "length", "embed"))


def _permute_rows(rows, index, inverse):
    """`rows[index]` for a permutation `index` of the rows; its gradient is a gather
    by `inverse` (autodiff would scatter, 2-3x slower on CPU)."""

    @ops.custom_gradient
    def permute(rows):
        def grad(*args, upstream=None):
            if upstream is None:
                (upstream,) = args
            return ops.take(upstream, inverse, axis=0)

        return ops.take(rows, index, axis=0), grad

    return permute(rows)


# Token-choice routing sends each token to at most K (small) slots, so both
# directions of the data movement can be written as gathers: tokens -> slots
# by `slot_token`, slots -> tokens by `token_slot`. Autodiff would turn every
# gather's gradient into a segment sum, which is 2-3x slower on CPU; these
# custom gradients keep the backward pass made of gathers too. Expert choice
# (K = E) keeps the autodiff path.
_MAX_CHOICES_FOR_GATHER_GRADIENTS = 2


def _uses_gather_gradients(plan):
    return plan.token_slot.shape[-1] <= _MAX_CHOICES_FOR_GATHER_GRADIENTS


def _with_zero_row(rows):
    """Appends a zero row, read by empty slots and by dropped assignments."""
    return ops.concatenate([rows, ops.zeros((1, rows.shape[-1]), rows.dtype)], axis=0)


def _sum_over_choices(rows, index):
    """sum_k rows[index[:, k]] for index [N, K] (rows already zero-padded)."""
    total = ops.take(rows, index[:, 0], axis=0)
    for k in range(1, index.shape[-1]):
        total = total + ops.take(rows, index[:, k], axis=0)
    return total


def _gather_rows_with_gather_gradient(tokens, slot_token, token_slot):
    """slots[s] = tokens[slot_token[s]] (0 for empty slots)."""

    @ops.custom_gradient
    def gather(tokens):
        slots = ops.take(_with_zero_row(tokens), slot_token, axis=0)

        def grad(*args, upstream=None):
            if upstream is None:
                (upstream,) = args
            return _sum_over_choices(_with_zero_row(upstream), token_slot)

        return slots, grad

    return gather(tokens)


def _weighted_gather_with_gather_gradient(slots, token_weight, token_slot, slot_weight,
                                          slot_token):
    """y[t] = sum_k token_weight[t, k] * slots[token_slot[t, k]]."""

    # Float tensors go in as arguments (JAX forbids closing over values that
    # are being differentiated); the integer maps are closed over.
    @ops.custom_gradient
    def combine(slots, token_weight, slot_weight):
        padded = _with_zero_row(slots)
        picked = [ops.take(padded, token_slot[:, k], axis=0)
                  for k in range(token_slot.shape[-1])]
        y = picked[0] * token_weight[:, :1]
        for k in range(1, len(picked)):
            y = y + picked[k] * token_weight[:, k:k + 1]

        def grad(*args, upstream=None):
            if upstream is None:
                (upstream,) = args
            d_slots = ops.take(_with_zero_row(upstream), slot_token, axis=0)
            d_slots = d_slots * slot_weight[:, None]
            d_weight = ops.stack([ops.sum(upstream * p, axis=-1) for p in picked], axis=-1)
            # slot_weight holds the same values as token_weight, whose
            # gradient already reaches the router.
            return d_slots, d_weight, ops.zeros_like(slot_weight)

        return y, grad

    return combine(slots, token_weight, slot_weight)


def get_dispatcher(mode, dropless_buffer_factor=None):
    """Returns the dispatcher for `mode` ("einsum", "gather", "dropless" or "auto").

    "auto" picks einsum on TPU and gather everywhere else; "dropless" is
    refused on TPU with the TensorFlow backend (its grouped matmul needs
    dynamic shapes there); on JAX it runs on TPU with the megablox kernel.

    `dropless_buffer_factor`: the dropless dispatcher's receive buffer with
    experts split over a mesh (`keras_moe.dropless_exchange`); only with
    mode "dropless".

    Example:
    >>> get_dispatcher("gather").name
    'gather'
    """
    if mode not in DISPATCH_MODES:
        raise ValueError(f"`dispatch` must be one of {DISPATCH_MODES}, got {mode!r}.")
    if dropless_buffer_factor is not None and mode != "dropless":
        raise ValueError("`dropless_buffer_factor` sizes the dropless dispatcher's receive "
                         f"buffer; it needs dispatch='dropless', got dispatch={mode!r}.")
    platform = sharding.accelerator_platform()
    if mode == "auto":
        mode = "einsum" if platform == "tpu" else "gather"
    if mode == "dropless":
        if platform == "tpu" and keras.backend.backend() != "jax":
            raise ValueError(
                "dispatch='dropless' on TPU needs the JAX backend (its grouped matmul there "
                "is the megablox kernel; TensorFlow's needs shapes that depend on the "
                "routing, which TPUs do not compile): set KERAS_BACKEND=jax, or use "
                "dispatch='einsum' (or 'auto') with a capacity factor.")
        return DroplessDispatcher(dropless_buffer_factor)
    return EinsumDispatcher() if mode == "einsum" else GatherDispatcher()
