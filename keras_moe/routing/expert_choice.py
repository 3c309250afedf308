"""Expert-choice routing (Zhou et al., 2022): each expert picks its top-C tokens."""

from __future__ import annotations

import keras
from keras import ops

from keras_moe.routing.base import AssignResult, Router
from keras_moe.tensor_types import Tensor


@keras.saving.register_keras_serializable(package="keras_moe")
class ExpertChoiceRouter(Router):
    """Expert-choice routing (Zhou et al., 2022): each expert picks its top-C tokens.

    Every expert is exactly full, so no load-balancing loss is needed (the aux
    loss is 0); a token may be chosen by several experts or by none. Because an
    expert's choice looks at every token of the group, this router is not
    causal: `MoeLayer(causal=True)` refuses it. Capacity is
    `ceil(cf * S / E)`, and at most `S` (an expert cannot pick more tokens
    than the group has).

    Args:
        num_experts: number of experts.
        **kwargs: see `Router`.

    Example:
    >>> import numpy as np
    >>> router = ExpertChoiceRouter(num_experts=4)
    >>> logits = router(np.random.rand(1, 8, 16).astype("float32"))
    >>> routing = router.route(logits, np.ones((1, 8)), capacity=2)
    >>> np.sum(routing.kept, axis=(0, 1)).tolist()  # each expert takes 2 tokens
    [2.0, 2.0, 2.0, 2.0]
    """

    is_causal_safe = False

    def num_choices(self) -> int:
        return self.num_experts

    def slots_per_token(self) -> int:
        return 1  # capacity ceil(cf * S / E): on average one expert per token

    def assign(
        self,
        probs: Tensor,
        token_mask: Tensor,
        capacity: int | Tensor,
        training: bool | None,
        group_capacity: Tensor | None = None,
    ) -> AssignResult:
        mask = token_mask
        shape = ops.shape(probs)
        num_groups, group_size, num_experts = shape[0], shape[1], self.num_experts
        # Padding scores below any real token, so experts pick it only when
        # the group has fewer real tokens than the capacity; it is unkept then.
        scores = probs - 2.0 * (1.0 - mask[..., None])
        _, chosen_tokens = ops.top_k(ops.transpose(scores, (0, 2, 1)), capacity)  # [G, E, C]
        group_ids = ops.reshape(ops.arange(num_groups, dtype="int32"), (-1, 1, 1))
        expert_ids = ops.reshape(ops.arange(num_experts, dtype="int32"), (1, -1, 1))
        flat = (group_ids * num_experts + expert_ids) * group_size + ops.cast(
            chosen_tokens, "int32"
        )
        flat = ops.reshape(flat, (-1, 1))
        slots = ops.broadcast_to(
            ops.reshape(ops.arange(capacity, dtype="float32"), (1, 1, -1)),
            ops.shape(chosen_tokens),
        )
        total = num_groups * num_experts * group_size
        chosen = ops.scatter(flat, ops.ones((ops.shape(flat)[0],), "float32"), (total,))
        position = ops.scatter(flat, ops.reshape(slots, (-1,)), (total,))
        chosen = ops.transpose(
            ops.reshape(chosen, (num_groups, num_experts, group_size)), (0, 2, 1)
        )
        position = ops.transpose(
            ops.reshape(position, (num_groups, num_experts, group_size)), (0, 2, 1)
        )
        kept = chosen * mask[..., None]
        if group_capacity is not None:  # each expert keeps its best `group_capacity` tokens
            limit = ops.cast(ops.reshape(group_capacity, (-1, 1, 1)), position.dtype)
            kept = kept * ops.cast(position < limit, kept.dtype)
        expert_index = ops.broadcast_to(
            ops.reshape(ops.arange(num_experts, dtype="int32"), (1, 1, -1)), ops.shape(probs)
        )
        return expert_index, position, kept, probs, ops.zeros((), "float32")
