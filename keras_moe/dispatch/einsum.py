"""One-hot einsum dispatch (GShard's formulation; TPU / GSPMD friendly).

Dispatch and combine tensors `[G, S, E, C]` are contracted with einsums.
Shapes are static, which is what TPUs want, and under a JAX mesh the buffers
move between the token and expert layouts by two all-to-alls
(`keras_moe.parallel.token_exchange`). Cost grows with `S * E * C`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

from keras import ops

from keras_moe.dispatch.base import Dispatcher
from keras_moe.parallel import sharding, token_exchange
from keras_moe.tensor_types import Tensor

if TYPE_CHECKING:
    from keras_moe.routing import RoutingInstructions


class EinsumPlan(NamedTuple):
    """What `EinsumDispatcher` derives from `RoutingInstructions`."""

    num_groups: int | Tensor
    group_size: int
    num_experts: int
    capacity: int
    dispatch_tensor: Tensor  # [G, S, E, C] 0/1
    combine_tensor: Tensor  # [G, S, E, C] combine weights


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

    def plan(self, routing: RoutingInstructions) -> EinsumPlan:
        if not isinstance(routing.capacity, int):
            raise ValueError(
                "dispatch='einsum' needs a static expert capacity, but the routing group's "
                "size is only known at run time (group_size='batch' with an unknown batch "
                "size). Batch with a fixed size (drop_remainder=True), set `group_size` to "
                "'sequence' or an integer, or use dispatch='gather'."
            )
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

    def dispatch(self, x: Tensor, plan: EinsumPlan) -> Tensor:
        dispatch_tensor = ops.cast(plan.dispatch_tensor, x.dtype)
        expert_inputs = ops.einsum("gsec,gsd->egcd", dispatch_tensor, x)
        return token_exchange.to_experts(expert_inputs)

    def combine(self, expert_outputs: Tensor, plan: EinsumPlan) -> Tensor:
        expert_outputs = token_exchange.from_experts(expert_outputs)
        combine_tensor = ops.cast(plan.combine_tensor, expert_outputs.dtype)
        y = ops.einsum("gsec,egcd->gsd", combine_tensor, expert_outputs)
        return sharding.with_logical_constraint(y, ("batch", "length", "embed"))
