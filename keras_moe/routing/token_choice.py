"""Token-choice routers: each token picks its top-K experts (Switch top-1, GShard top-2, top-k).

Experts serve the choices that ask for a slot in priority order until their
capacity is full; the rest are dropped (combine weight 0).
"""

from __future__ import annotations

from typing import Any

import keras
from keras import ops

from keras_moe.arguments import (
    EvalSecondExpertPolicy,
    NormalizeGates,
    SecondExpertPolicy,
    check_values,
)
from keras_moe.routing import losses as router_losses
from keras_moe.routing import selection
from keras_moe.routing.base import AssignResult, Router
from keras_moe.routing.capacity import _keep_within_capacity, _priority_order
from keras_moe.tensor_types import Shape, Tensor


def _normalized(gates):
    """Gates [..., K] divided by their sum (0 where all are 0)."""
    return gates / ops.maximum(ops.sum(gates, axis=-1, keepdims=True), 1e-9)


class TokenChoiceRouter(Router):
    """Base of the routers where each token picks its top-K experts.

    Experts take the choices that ask for a slot in priority order (every
    first choice before any second choice; tokens in sequence order, or by
    router confidence with `batch_prioritized_routing`) until their capacity is
    full. Subclasses implement `num_choices`, `choices_asking` (which of the K
    choices ask for a slot) and `combine_weights`; `select` (which K experts,
    by default the K best scores) may be overridden too.

    Example (a top-2 router whose second choice asks only when it is at least
    half as likely as the first):
    >>> import numpy as np
    >>> from keras import ops
    >>> class HalfTop2(TokenChoiceRouter):
    ...     def num_choices(self):
    ...         return 2
    ...     def choices_asking(self, gates, token_mask, training):
    ...         second = ops.cast(gates[..., 1] >= 0.5 * gates[..., 0], "float32")
    ...         return ops.stack([token_mask, token_mask * second], axis=-1)
    ...     def combine_weights(self, gates, kept):
    ...         return gates
    >>> router = HalfTop2(num_experts=4)
    >>> logits = np.log(np.array([[[0.6, 0.2, 0.1, 0.1], [0.4, 0.3, 0.2, 0.1]]], "float32"))
    >>> np.asarray(router.route(logits, np.ones((1, 2)), capacity=2).kept).tolist()
    [[[1.0, 0.0], [1.0, 1.0]]]
    """

    picks_experts_per_token = True

    def assign(
        self,
        probs: Tensor,
        token_mask: Tensor,
        capacity: int | Tensor,
        training: bool | None,
        group_capacity: Tensor | None = None,
    ) -> AssignResult:
        if group_capacity is not None:
            capacity = ops.reshape(group_capacity, (-1, 1, 1))
        gates, expert_index = self.select(probs, token_mask, training)
        active = self.choices_asking(gates, token_mask, training)
        distribution = self.expert_probabilities(probs)
        aux = router_losses.load_balancing_loss(distribution, expert_index[..., 0], token_mask)
        order = _priority_order(distribution, token_mask, self.batch_prioritized_routing)
        position, kept = _keep_within_capacity(
            expert_index, active, self.num_experts, capacity, order
        )
        return expert_index, position, kept, self.combine_weights(gates, kept), aux

    def selected_choices(self, token_mask: Tensor, kept: Tensor) -> Tensor:
        return ops.broadcast_to(token_mask[..., None], ops.shape(kept))

    def select(
        self, scores: Tensor, token_mask: Tensor, training: bool | None
    ) -> tuple[Tensor, Tensor]:
        """`(gates, expert_index)`, both [G, S, K]: each token's K experts, best
        first, and their scores."""
        return ops.top_k(scores, self.num_choices())

    def choices_asking(self, gates: Tensor, token_mask: Tensor, training: bool | None) -> Tensor:
        """Float [G, S, K]: 1 where a choice asks for a slot (real tokens only)."""
        raise NotImplementedError

    def combine_weights(self, gates: Tensor, kept: Tensor) -> Tensor:
        """Float [G, S, K] combine weights from the K chosen probabilities."""
        raise NotImplementedError


@keras.saving.register_keras_serializable(package="keras_moe")
class TopKRouter(TokenChoiceRouter):
    """Token-choice router: each token picks its `k` highest-scoring experts.

    Combine weights are the scores of the chosen experts (optionally
    renormalised over the k choices, then multiplied by
    `routed_scaling_factor`). Experts take assignments in priority order until
    their capacity is full; the rest are dropped.

    With `n_group > 1` the selection is group-limited (DeepSeek-V3): the
    experts form `n_group` groups of consecutive indices, each token keeps the
    `topk_group` groups whose two best scores sum highest and picks its k
    experts among theirs. With `selection_bias=True` a non-trainable float32
    per-expert bias (`expert_bias`, DeepSeek-V3's `e_score_correction_bias`)
    is added to the scores for the selection only, in training and inference
    alike; the combine weights use the unbiased scores. With
    `bias_update_rate > 0` every training call (`training=True`, as in
    `model.fit`) moves it by `rate * sign(mean_load - load)` after selecting,
    where `load` counts each expert's choices over the global batch
    (loss-free balancing, Wang et al., arXiv 2408.15664). Inference never
    moves it, and it is saved with the router's weights.

    Args:
        num_experts: number of experts.
        k: experts per token, 1 <= k <= num_experts (and at most the experts
            of the `topk_group` kept groups).
        normalize_top_k: renormalise the k chosen scores to sum to 1.
        batch_prioritized_routing: serve tokens by router confidence rather
            than sequence order when filling capacity (Riquelme et al., V-MoE).
        n_group: number of expert groups, dividing `num_experts`; 1 (default)
            turns group-limited selection off.
        topk_group: groups each token picks from, 1 <= topk_group <= n_group;
            defaults to `n_group` (no limit).
        selection_bias: keep the per-expert selection bias `expert_bias`.
        bias_update_rate: the loss-free balancing step, >= 0 (DeepSeek-V3:
            1e-3); 0 (default) never updates the bias. > 0 needs
            `selection_bias=True`.
        **kwargs: see `Router` (`score_function`, `routed_scaling_factor`, ...).

    Example:
    >>> import numpy as np
    >>> router = TopKRouter(num_experts=4, k=2)
    >>> logits = router(np.random.rand(1, 8, 16).astype("float32"))
    >>> routing = router.route(logits, np.ones((1, 8)), capacity=4)
    >>> tuple(routing.expert_index.shape)
    (1, 8, 2)

    A DeepSeek-V3-style router: sigmoid scores, 4 groups of 2 experts of which
    each token keeps 2, normalised and scaled weights, loss-free balancing:
    >>> router = TopKRouter(num_experts=8, k=2, score_function="sigmoid",
    ...                     normalize_top_k=True, routed_scaling_factor=2.5, n_group=4,
    ...                     topk_group=2, selection_bias=True, bias_update_rate=1e-3)
    >>> logits = router(np.random.rand(1, 8, 16).astype("float32"))
    >>> routing = router.route(logits, np.ones((1, 8)), capacity=8)
    >>> bool(np.allclose(np.sum(routing.combine_weight, -1), 2.5))
    True
    >>> groups = np.asarray(routing.expert_index) // 2  # each token's experts span <= 2 groups
    >>> max(len(set(token)) for token in groups[0].tolist()) <= 2
    True
    """

    def __init__(
        self,
        num_experts: int,
        k: int = 1,
        normalize_top_k: bool = False,
        batch_prioritized_routing: bool = False,
        n_group: int = 1,
        topk_group: int | None = None,
        selection_bias: bool = False,
        bias_update_rate: float = 0.0,
        **kwargs: Any,
    ) -> None:
        super().__init__(num_experts, **kwargs)
        if topk_group is None:
            topk_group = n_group
        check_values(
            dict(k=k, n_group=n_group, topk_group=topk_group, bias_update_rate=bias_update_rate)
        )
        if k > num_experts:
            raise ValueError(f"`k` must be <= num_experts ({num_experts}), got k={k}.")
        if num_experts % n_group:
            raise ValueError(
                f"`n_group` must divide num_experts ({num_experts}), got n_group={n_group}."
            )
        if topk_group > n_group:
            raise ValueError(
                f"`topk_group` must be <= n_group ({n_group}), got topk_group={topk_group}."
            )
        eligible = topk_group * (num_experts // n_group)
        if k > eligible:
            raise ValueError(
                f"`k` must be <= the experts of the kept groups, topk_group * num_experts / "
                f"n_group = {eligible}, got k={k}."
            )
        if bias_update_rate > 0 and not selection_bias:
            raise ValueError(
                f"`bias_update_rate` > 0 ({bias_update_rate}) needs `selection_bias=True`."
            )
        self.k = k
        self.normalize_top_k = bool(normalize_top_k)
        self.batch_prioritized_routing = bool(batch_prioritized_routing)
        self.n_group = n_group
        self.topk_group = topk_group
        self.selection_bias = bool(selection_bias)
        self.bias_update_rate = float(bias_update_rate)

    def build(self, input_shape: Shape) -> None:
        super().build(input_shape)
        if self.selection_bias:
            # Only the first replica's update is kept: every replica computes
            # the same one from the global counts.
            self.expert_bias = self.add_weight(
                name="expert_bias",
                shape=(self.num_experts,),
                initializer="zeros",
                dtype="float32",
                trainable=False,
                autocast=False,
                aggregation="only_first_replica",
            )

    def num_choices(self) -> int:
        return self.k

    def select(
        self, scores: Tensor, token_mask: Tensor, training: bool | None
    ) -> tuple[Tensor, Tensor]:
        if not self.selection_bias and self.topk_group == self.n_group:
            return super().select(scores, token_mask, training)
        choice_scores = scores
        if self.selection_bias:
            choice_scores = scores + ops.convert_to_tensor(self.expert_bias)
        expert_index = selection.group_limited_top_k(
            choice_scores, self.k, self.n_group, self.topk_group
        )
        if training and self.bias_update_rate > 0:
            counts = selection.expert_counts(expert_index, token_mask, self.num_experts)
            self.expert_bias.assign(
                selection.balancing_bias_step(
                    ops.convert_to_tensor(self.expert_bias), counts, self.bias_update_rate
                )
            )
        return ops.take_along_axis(scores, expert_index, axis=-1), expert_index

    def choices_asking(self, gates: Tensor, token_mask: Tensor, training: bool | None) -> Tensor:
        return ops.broadcast_to(token_mask[..., None], ops.shape(gates))

    def combine_weights(self, gates: Tensor, kept: Tensor) -> Tensor:
        if self.normalize_top_k:
            return _normalized(gates)
        return gates

    def get_config(self) -> dict[str, Any]:
        config = super().get_config()
        config.update(
            k=self.k,
            normalize_top_k=self.normalize_top_k,
            batch_prioritized_routing=self.batch_prioritized_routing,
            n_group=self.n_group,
            topk_group=self.topk_group,
            selection_bias=self.selection_bias,
            bias_update_rate=self.bias_update_rate,
        )
        return config


@keras.saving.register_keras_serializable(package="keras_moe")
class SwitchRouter(TopKRouter):
    """Switch Transformer top-1 router: combine weight = the chosen expert's probability.

    Args:
        num_experts: number of experts.
        **kwargs: `batch_prioritized_routing` and the `Router` arguments.

    Example:
    >>> import numpy as np
    >>> router = SwitchRouter(num_experts=8, jitter_noise=0.01)
    >>> logits = router(np.random.rand(2, 16, 32).astype("float32"))
    >>> routing = router.route(logits, np.ones((2, 16)), capacity=3)
    >>> tuple(routing.kept.shape)  # [G, S, K]: one choice per token
    (2, 16, 1)
    >>> expert, kept = np.asarray(routing.expert_index), np.asarray(routing.kept)
    >>> tokens_per_expert = [np.bincount(expert[g][kept[g] > 0], minlength=8) for g in range(2)]
    >>> int(np.max(tokens_per_expert)) <= 3  # each expert keeps at most `capacity` per group
    True
    """

    def __init__(self, num_experts: int, **kwargs: Any) -> None:
        kwargs.pop("k", None)
        kwargs.pop("normalize_top_k", None)
        super().__init__(num_experts, k=1, normalize_top_k=False, **kwargs)

    def get_config(self) -> dict[str, Any]:
        config = super().get_config()
        config.pop("k")
        config.pop("normalize_top_k")
        return config


@keras.saving.register_keras_serializable(package="keras_moe")
class Top2Router(TokenChoiceRouter):
    """GShard top-2 router (Lepikhin et al., Algorithm 1).

    The top-1 expert always gets the token (capacity permitting). The second
    expert gets it according to `second_expert_policy`:
    - "all": always;
    - "random": with probability `g2 / threshold` (GShard: threshold 0.5,
      i.e. probability 2·g2), where g2 is the normalised second gate;
    - "threshold": only if g2 > threshold.
    Gates are renormalised to sum to 1 either before the capacity mask
    (GShard) or over the assignments that survive it.

    Args:
        num_experts: number of experts, >= 2.
        second_expert_policy: policy in training: "all", "random", "threshold".
        eval_second_expert_policy: policy in inference; "random" is not
            allowed here so that evaluation is deterministic.
        second_expert_threshold: threshold for the policy; defaults to 0.5
            for "random" and 0.2 for "threshold".
        normalize_gates: "before_capacity" (GShard) or "after_capacity".
        batch_prioritized_routing: serve tokens by router confidence.
        **kwargs: see `Router`.

    Example:
    >>> import numpy as np
    >>> router = Top2Router(num_experts=4, second_expert_policy="all")
    >>> logits = router(np.random.rand(1, 8, 16).astype("float32"))
    >>> routing = router.route(logits, np.ones((1, 8)), capacity=8)
    >>> np.allclose(np.sum(routing.combine_weight, -1), 1.0)
    True
    """

    def __init__(
        self,
        num_experts: int,
        second_expert_policy: SecondExpertPolicy = "random",
        eval_second_expert_policy: EvalSecondExpertPolicy = "all",
        second_expert_threshold: float | None = None,
        normalize_gates: NormalizeGates = "before_capacity",
        batch_prioritized_routing: bool = False,
        **kwargs: Any,
    ) -> None:
        super().__init__(num_experts, **kwargs)
        if num_experts < 2:
            raise ValueError(f"`num_experts` must be >= 2 for top-2 routing, got {num_experts}.")
        check_values(
            dict(
                second_expert_policy=second_expert_policy,
                eval_second_expert_policy=eval_second_expert_policy,
                second_expert_threshold=second_expert_threshold,
                normalize_gates=normalize_gates,
            )
        )
        self.second_expert_policy = second_expert_policy
        self.eval_second_expert_policy = eval_second_expert_policy
        self.second_expert_threshold = second_expert_threshold
        self.normalize_gates = normalize_gates
        self.batch_prioritized_routing = bool(batch_prioritized_routing)

    def num_choices(self) -> int:
        return 2

    def _threshold(self, policy):
        if self.second_expert_threshold is not None:
            return self.second_expert_threshold
        return 0.5 if policy == "random" else 0.2

    def choices_asking(self, gates: Tensor, token_mask: Tensor, training: bool | None) -> Tensor:
        policy = self.second_expert_policy if training else self.eval_second_expert_policy
        second_gate = _normalized(gates)[..., 1]
        if policy == "all":
            take_second = ops.ones_like(second_gate)
        elif policy == "threshold":
            take_second = ops.cast(second_gate > self._threshold(policy), "float32")
        else:
            draw = keras.random.uniform(ops.shape(second_gate), seed=self.seed_generator)
            take_second = ops.cast(draw < second_gate / self._threshold(policy), "float32")
        return ops.stack([token_mask, token_mask * take_second], axis=-1)

    def combine_weights(self, gates: Tensor, kept: Tensor) -> Tensor:
        if self.normalize_gates == "before_capacity":
            return _normalized(gates)
        return _normalized(gates * kept)

    def get_config(self) -> dict[str, Any]:
        config = super().get_config()
        config.update(
            second_expert_policy=self.second_expert_policy,
            eval_second_expert_policy=self.eval_second_expert_policy,
            second_expert_threshold=self.second_expert_threshold,
            normalize_gates=self.normalize_gates,
            batch_prioritized_routing=self.batch_prioritized_routing,
        )
        return config
