"""Dropless dispatch: no capacity; each expert multiplies exactly its tokens.

The token-expert assignments are sorted by expert and the experts run a
grouped matmul (`keras_moe.dispatch.grouped_matmul`), as MegaBlocks does on GPUs. With
experts split over a mesh the rows travel by `keras_moe.dispatch.dropless_exchange`;
otherwise every device sorts its own rows and the experts' weights are
gathered.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from keras import ops

from keras_moe.arguments import check_values
from keras_moe.dispatch import dropless_exchange
from keras_moe.dispatch.base import Dispatcher
from keras_moe.parallel import sharding, token_exchange
from keras_moe.tensor_types import Tensor

if TYPE_CHECKING:
    import keras

    from keras_moe.routing import Router, RoutingInstructions


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
    >>> from keras_moe.layers.experts import FeedForwardExperts
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
    >>> from keras_moe.dispatch.gather import GatherDispatcher
    >>> bool(np.allclose(y, GatherDispatcher().apply(x, routing, experts), atol=1e-5))
    True
    """

    name = "dropless"
    drops_tokens = False

    def __init__(self, buffer_factor: float | None = None) -> None:
        check_values({"dropless_buffer_factor": buffer_factor})
        self.buffer_factor = buffer_factor

    def check(self, router: Router, experts: keras.layers.Layer) -> None:
        if not router.picks_experts_per_token:
            raise ValueError(
                "dispatch='dropless' has no capacity, so it needs a token-choice router "
                f"(Switch, top-2, top-k); got {type(router).__name__}."
            )
        if not experts.takes_sorted_rows:
            raise ValueError(
                f"dispatch='dropless' runs the experts on tokens sorted by expert, which "
                f"{type(experts).__name__} does not take (expert-parallel experts exchange "
                "fixed-capacity buffers); use dispatch='gather' or 'einsum' with it."
            )

    def expert_capacity(
        self,
        router: Router,
        group_size: int | Tensor,
        capacity_factor: float,
        min_expert_capacity: int,
    ) -> int | Tensor:
        # A token takes at most one slot of an expert: a group's size is room for all.
        return group_size

    def apply_and_report(
        self,
        x: Tensor,
        routing: RoutingInstructions,
        experts: keras.layers.Layer,
        training: bool | None = None,
    ) -> tuple[Tensor, Tensor]:
        layout, reason = dropless_exchange.plan(routing.num_experts, x.shape[0])
        if layout is None:
            return self._gathered_weights(x, routing, experts, training, reason), routing.kept
        y, kept = dropless_exchange.apply(x, routing, experts, layout, training, self.buffer_factor)
        return sharding.with_logical_constraint(y, ("batch", "length", "embed")), kept

    def apply(
        self,
        x: Tensor,
        routing: RoutingInstructions,
        experts: keras.layers.Layer,
        training: bool | None = None,
    ) -> Tensor:
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
        inverse = ops.scatter(
            order[:, None], ops.arange(num_assignments, dtype="int32"), (num_assignments,)
        )  # the inverse permutation, without a sort
        group_sizes = ops.segment_sum(ops.ones_like(expert), expert, num_segments=num_experts + 1)[
            :num_experts
        ]
        tokens = ops.reshape(x, (-1, 1, d_model))
        assignments = ops.reshape(
            ops.broadcast_to(tokens, (ops.shape(tokens)[0], num_choices, d_model)), (-1, d_model)
        )
        rows = _permute_rows(assignments, order, inverse)
        token_exchange.note_choice(
            "gspmd",
            "dispatch='dropless' sorts each device's tokens by expert and the "
            f"experts' weights are gathered to every device ({reason})",
        )
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
