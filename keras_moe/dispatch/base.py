"""The dispatcher interface: tokens into expert buffers `[E, G, C, d]` and back.

`keras_moe.dispatch` lists the implementations and picks one by name.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from keras_moe.tensor_types import Tensor

if TYPE_CHECKING:
    import keras

    from keras_moe.routing import Router, RoutingInstructions


class Dispatcher:
    """Moves tokens into expert buffers `[E, G, C, d]` and expert outputs back.

    `plan(routing)` derives the per-call data once; `dispatch(x, plan)` maps
    group tokens `[G, S, d]` to expert buffers, `combine(expert_outputs, plan)`
    maps them back, weighted by the combine weights (0 for dropped tokens).
    """

    name: str | None = None
    drops_tokens = True  # False: no capacity, every assignment is computed

    def check(self, router: Router, experts: keras.layers.Layer) -> None:
        """Raises ValueError, naming `dispatch`, when `router` or `experts` cannot be used."""

    def expert_capacity(
        self,
        router: Router,
        group_size: int | Tensor,
        capacity_factor: float,
        min_expert_capacity: int,
    ) -> int | Tensor:
        """Slots per expert per group: the router's `expert_capacity` (see it)."""
        return router.expert_capacity(group_size, capacity_factor, min_expert_capacity)

    def apply_and_report(
        self,
        x: Tensor,
        routing: RoutingInstructions,
        experts: keras.layers.Layer,
        training: bool | None = None,
    ) -> tuple[Tensor, Tensor]:
        """`(apply(...), kept)`: the outputs and which assignments were computed
        (`routing.kept`, less any the dispatcher itself dropped)."""
        return self.apply(x, routing, experts, training), routing.kept

    def apply(
        self,
        x: Tensor,
        routing: RoutingInstructions,
        experts: keras.layers.Layer,
        training: bool | None = None,
    ) -> Tensor:
        """Outputs `[G, S, d]` of the `experts` layer for group tokens `x` routed by `routing`."""
        plan = self.plan(routing)
        expert_outputs = experts(self.dispatch(x, plan), training=training)
        return self.combine(expert_outputs, plan)

    def plan(self, routing: RoutingInstructions) -> Any:
        """The per-call data `dispatch` and `combine` share (each dispatcher's own type)."""
        raise NotImplementedError

    def dispatch(self, x: Tensor, plan: Any) -> Tensor:
        """Expert buffers `[E, G, C, d]` of group tokens `x` `[G, S, d]`."""
        raise NotImplementedError

    def combine(self, expert_outputs: Tensor, plan: Any) -> Tensor:
        """Token outputs `[G, S, d]` of expert outputs `[E, G, C, d]`, combine-weighted."""
        raise NotImplementedError
