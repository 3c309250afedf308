"""The dispatcher interface: tokens into expert buffers `[E, G, C, d]` and back.

`keras_moe.dispatch` lists the implementations and picks one by name.
"""


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
