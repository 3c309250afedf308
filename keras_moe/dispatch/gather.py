"""Gather/scatter dispatch by slot index (CPU / GPU friendly).

For every expert slot the plan holds which token fills it; tokens are gathered
into slots and slot outputs scatter-added (or, for token choice, gathered)
back into tokens. Memory and time are O(tokens * d).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

from keras import ops

from keras_moe.dispatch.base import Dispatcher
from keras_moe.parallel import sharding, token_exchange
from keras_moe.tensor_types import Tensor

if TYPE_CHECKING:
    from keras_moe.routing import RoutingInstructions


class GatherPlan(NamedTuple):
    """What `GatherDispatcher` derives from `RoutingInstructions`."""

    num_groups: int | Tensor
    group_size: int | Tensor  # int, or a scalar tensor when known at run time only
    num_experts: int
    capacity: int | Tensor  # int, or a scalar tensor (see RoutingInstructions)
    slot_token: Tensor  # int32 [E*G*C]: token index, or G*S if the slot is empty
    slot_weight: Tensor  # float32 [E*G*C]
    token_slot: Tensor  # int32 [G*S, K]: slot index, or E*G*C if not kept
    token_weight: Tensor  # float32 [G*S, K]


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
    >>> from keras_moe.dispatch.einsum import EinsumDispatcher
    >>> einsum = EinsumDispatcher()  # same numbers as the einsum path
    >>> bool(np.allclose(expert_inputs, einsum.dispatch(x, einsum.plan(routing))))
    True
    """

    name = "gather"

    def plan(self, routing: RoutingInstructions) -> GatherPlan:
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

    def dispatch(self, x: Tensor, plan: GatherPlan) -> Tensor:
        d_model = x.shape[-1]
        tokens = ops.reshape(x, (-1, d_model))
        if _uses_gather_gradients(plan):
            expert_inputs = _gather_rows_with_gather_gradient(
                tokens, plan.slot_token, plan.token_slot
            )
        else:
            expert_inputs = ops.take(_with_zero_row(tokens), plan.slot_token, axis=0)
        expert_inputs = ops.reshape(
            expert_inputs, (plan.num_experts, plan.num_groups, plan.capacity, d_model)
        )
        token_exchange.note_choice(
            "gspmd",
            "dispatch='gather' fills expert slots by gather and scatter; the layout "
            "constraints leave their movement to GSPMD (dispatch='einsum' exchanges by "
            "all-to-all)",
            expert_inputs.shape,
        )
        return sharding.with_logical_constraint(expert_inputs, ("expert", "batch", None, "embed"))

    def combine(self, expert_outputs: Tensor, plan: GatherPlan) -> Tensor:
        d_model = expert_outputs.shape[-1]
        outputs = ops.reshape(expert_outputs, (-1, d_model))
        num_tokens = plan.num_groups * plan.group_size
        if _uses_gather_gradients(plan):
            y = _weighted_gather_with_gather_gradient(
                outputs,
                ops.cast(plan.token_weight, outputs.dtype),
                plan.token_slot,
                ops.cast(plan.slot_weight, outputs.dtype),
                plan.slot_token,
            )
        else:
            weighted = outputs * ops.cast(plan.slot_weight, outputs.dtype)[:, None]
            y = ops.segment_sum(weighted, plan.slot_token, num_segments=num_tokens + 1)
            y = y[:num_tokens]
        y = ops.reshape(y, (plan.num_groups, plan.group_size, d_model))
        return sharding.with_logical_constraint(y, ("batch", "length", "embed"))


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


def _weighted_gather_with_gather_gradient(slots, token_weight, token_slot, slot_weight, slot_token):
    """y[t] = sum_k token_weight[t, k] * slots[token_slot[t, k]]."""

    # Float tensors go in as arguments (JAX forbids closing over values that
    # are being differentiated); the integer maps are closed over.
    @ops.custom_gradient
    def combine(slots, token_weight, slot_weight):
        padded = _with_zero_row(slots)
        picked = [ops.take(padded, token_slot[:, k], axis=0) for k in range(token_slot.shape[-1])]
        y = picked[0] * token_weight[:, :1]
        for k in range(1, len(picked)):
            y = y + picked[k] * token_weight[:, k : k + 1]

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
