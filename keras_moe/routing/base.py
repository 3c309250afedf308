"""The router base class and the routing result every dispatcher consumes.

A router is a small Keras layer that holds the router kernel and turns
tokens `[G, S, d]` into float32 logits `[G, S, E]` (`router(x)`), plus a
routing algorithm (`router.route(...)`) that turns those logits into
`RoutingInstructions`; `keras_moe.routing` lists the conventions.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import keras
from keras import ops

from keras_moe.arguments import ScoreFunction, check_values
from keras_moe.routing import losses as router_losses
from keras_moe.tensor_types import Shape, Tensor

AssignResult = tuple[Tensor, Tensor, Tensor, Tensor, Tensor]


class RoutingInstructions(NamedTuple):
    """Everything a dispatcher and the MoE layer need from routing.

    Attributes:
        expert_index: int32 [G, S, K].
        position: int32 [G, S, K] slot in the expert's buffer.
        combine_weight: float32 [G, S, K], 0 where not kept.
        kept: float32 [G, S, K], 1 where the assignment is dispatched.
        router_probs: float32 [G, S, E], the scores as a distribution over
            experts: the softmax itself, or the sigmoid scores divided by
            their sum (what the load-balancing loss and metrics read).
        router_logits: float32 [G, S, E].
        aux_loss: float32 scalar, unscaled load-balancing loss.
        z_loss: float32 scalar, unscaled router z-loss.
        capacity: slots per expert per group: a Python int, or an int32
            scalar tensor when the group size is known only at run time
            (TensorFlow, `group_size="batch"` with an unknown batch size).
        num_experts: Python int.
        selected: float32 [G, S, K], 1 where the choice selected its expert
            before any capacity limit (token choice: every real token's K
            choices; expert choice: the experts' picks). The balance losses
            and the load metrics count these.
    """

    expert_index: Tensor
    position: Tensor
    combine_weight: Tensor
    kept: Tensor
    router_probs: Tensor
    router_logits: Tensor
    aux_loss: Tensor
    z_loss: Tensor
    capacity: int | Tensor
    num_experts: int
    selected: Tensor | None = None


def default_router_initializer(scale: float = 1.0) -> keras.initializers.Initializer:
    """Fan-in truncated normal, std sqrt(scale / fan_in) (the Switch paper: scale 0.1 model-wide).

    Example:
    >>> import numpy as np
    >>> kernel = np.asarray(default_router_initializer()((4096, 8)))  # fan-in 4096
    >>> bool(abs(kernel.std() * 64 - 1) < 0.05)  # std 1 / sqrt(4096)
    True
    """
    return keras.initializers.VarianceScaling(
        scale=scale, mode="fan_in", distribution="truncated_normal"
    )


def _dynamic_ceil(factor, group_size):
    """int32 `ceil(factor * group_size)` of a run-time group size (float64, as Python)."""
    size = ops.cast(group_size, "float64")
    return ops.cast(ops.ceil(ops.multiply(size, factor)), "int32")


class Router(keras.layers.Layer):
    """Base router: float32 linear projection to expert logits, with jitter.

    `route()` is a template: it turns the logits into float32 probabilities and
    a float token mask, asks the subclass's `assign()` which experts and slots
    each token gets, and adds what every router reports (logits, z-loss,
    capacity). Token-choice routers share `TokenChoiceRouter.assign()` and
    implement only which choices ask for a slot and their combine weights.
    The scores are the softmax of the logits (Switch, GShard) or their sigmoid
    (DeepSeek-V3: each expert's affinity on its own); combine weights come
    from the scores and are multiplied by `routed_scaling_factor`.
    The layer defaults to `dtype="float32"`, so
    under a `mixed_bfloat16` policy its matmul and softmax still run in float32
    (the Switch paper's selective precision). Pass another `dtype` only to
    study what happens without it.

    Args:
        num_experts: number of experts, >= 1.
        jitter_noise: multiplicative noise amplitude applied in training to the
            router's own copy of the input, `x * U(1 - eps, 1 + eps)`. The
            experts always see the clean input. 0 disables it.
        kernel_initializer: initializer of the `[d_model, num_experts]` kernel;
            defaults to a fan-in truncated normal at scale 1.0, like the
            experts (see `default_router_initializer`).
        use_bias: whether the projection has a bias.
        seed: seed for jitter and random routing decisions.
        score_function: "softmax" (default) or "sigmoid", how logits become
            the scores that select experts and weight their outputs.
        routed_scaling_factor: number > 0 multiplying every combine weight
            (DeepSeek-V3 uses 2.5 with normalised top-k weights); 1 by default.
    """

    is_causal_safe = True  # False when a token's routing depends on later tokens
    batch_prioritized_routing = False  # True: capacity filled by confidence, not order
    picks_experts_per_token = False  # True: each token picks experts (dropless can run it)

    def __init__(
        self,
        num_experts: int,
        jitter_noise: float = 0.0,
        kernel_initializer: Any = None,
        use_bias: bool = False,
        seed: int | None = None,
        score_function: ScoreFunction = "softmax",
        routed_scaling_factor: float = 1.0,
        **kwargs: Any,
    ) -> None:
        kwargs.setdefault("dtype", "float32")
        super().__init__(**kwargs)
        check_values(
            dict(
                num_experts=num_experts,
                jitter_noise=jitter_noise,
                score_function=score_function,
                routed_scaling_factor=routed_scaling_factor,
            )
        )
        self.score_function = score_function
        self.routed_scaling_factor = float(routed_scaling_factor)
        self.num_experts = num_experts
        self.jitter_noise = float(jitter_noise)
        self.kernel_initializer = keras.initializers.get(
            kernel_initializer or default_router_initializer()
        )
        self.use_bias = use_bias
        self.seed = seed
        self.seed_generator = keras.random.SeedGenerator(seed)
        self.supports_masking = True  # logits keep the tokens' mask

    def build(self, input_shape: Shape) -> None:
        d_model = input_shape[-1]
        self.kernel = self.add_weight(
            name="kernel",
            shape=(d_model, self.num_experts),
            initializer=self.kernel_initializer,
        )
        if self.use_bias:
            self.bias = self.add_weight(name="bias", shape=(self.num_experts,), initializer="zeros")
        self.built = True

    def call(self, inputs: Tensor, training: bool | None = None) -> Tensor:
        """Returns router logits [..., E] in the router's compute dtype (float32)."""
        x = inputs
        if training and self.jitter_noise > 0:
            noise = keras.random.uniform(
                ops.shape(x),
                minval=1.0 - self.jitter_noise,
                maxval=1.0 + self.jitter_noise,
                dtype=self.compute_dtype,
                seed=self.seed_generator,
            )
            x = x * noise
        logits = ops.matmul(x, ops.cast(self.kernel, self.compute_dtype))
        if self.use_bias:
            logits = logits + ops.cast(self.bias, self.compute_dtype)
        return logits

    def num_choices(self) -> int:
        """K, the number of routing choices per token in the instructions."""
        raise NotImplementedError

    def slots_per_token(self) -> int:
        """Expert slots a token may fill, summed over experts (`K` for token choice)."""
        return self.num_choices()

    def expert_capacity(
        self, group_size: int | Tensor, capacity_factor: float, min_expert_capacity: int
    ) -> int | Tensor:
        """Slots per expert per group: `min(S, max(min, ceil(cf * K * S / E)))`, with
        `K = slots_per_token()`.

        A token takes at most one slot of an expert, so no expert can be sent
        more than the group's `S` tokens: capping at `S` drops nothing and keeps
        small groups (one token per sequence in cached decoding) from computing
        `min_expert_capacity` slots per token. `group_size` is a Python int, or
        a scalar tensor when the group size is only known at run time (then so
        is the capacity).

        Example:
        >>> from keras_moe.routing import SwitchRouter, Top2Router
        >>> SwitchRouter(num_experts=8).expert_capacity(64, 1.25, 4)  # ceil(1.25 * 64 / 8)
        10
        >>> Top2Router(num_experts=8).expert_capacity(64, 1.25, 4)  # two slots per token
        20
        >>> SwitchRouter(num_experts=64).expert_capacity(16, 1.0, 4)  # the minimum
        4
        """
        k = self.slots_per_token()
        if isinstance(group_size, int):
            capacity = math.ceil(capacity_factor * k * group_size / self.num_experts)
            return min(group_size, max(int(min_expert_capacity), capacity))
        capacity = _dynamic_ceil(capacity_factor * k / self.num_experts, group_size)
        return ops.minimum(
            ops.cast(group_size, "int32"), ops.maximum(int(min_expert_capacity), capacity)
        )

    def route(
        self,
        logits: Tensor,
        token_mask: Tensor,
        capacity: int | Tensor,
        training: bool | None = False,
        group_capacity: Tensor | None = None,
    ) -> RoutingInstructions:
        """Turns logits [G, S, E] into `RoutingInstructions`.

        Args:
            logits: float [G, S, E].
            token_mask: [G, S], 1 for real tokens, 0 for padding.
            capacity: slots per expert per group, the size of the expert
                buffers (the dispatcher's choice; the dropless dispatcher
                gives the group size, room for every assignment).
            training: whether the layer is training.
            group_capacity: optional int32 [G], the slots each group may fill
                per expert, at most `capacity`: what the group's real tokens
                give (`MoeLayer` computes it from the mask), so padding takes
                no capacity. None: `capacity` for every group.
        """
        logits = ops.cast(logits, "float32")
        scores = self.scores(logits)
        mask = ops.cast(token_mask, "float32")
        expert_index, position, kept, combine_weight, aux_loss = self.assign(
            scores, mask, capacity, training, group_capacity=group_capacity
        )
        combine_weight = ops.cast(combine_weight, "float32") * kept
        if self.routed_scaling_factor != 1.0:
            combine_weight = combine_weight * self.routed_scaling_factor
        probs = self.expert_probabilities(scores)
        return RoutingInstructions(
            expert_index=ops.cast(expert_index, "int32"),
            position=ops.cast(position, "int32"),
            combine_weight=combine_weight,
            kept=kept,
            router_probs=probs,
            router_logits=logits,
            aux_loss=aux_loss,
            z_loss=router_losses.router_z_loss(logits, mask),
            capacity=capacity,
            num_experts=self.num_experts,
            selected=self.selected_choices(mask, kept),
        )

    def selected_choices(self, token_mask: Tensor, kept: Tensor) -> Tensor:
        """Float32 [G, S, K]: 1 where a choice selected its expert, before capacity.

        By default the assignments that were kept (expert choice: each expert's
        picks); token-choice routers count every real token's K choices.
        """
        return kept

    def scores(self, logits: Tensor) -> Tensor:
        """Float32 scores [G, S, E] of float32 logits: their softmax or sigmoid."""
        if self.score_function == "sigmoid":
            return ops.sigmoid(logits)
        return ops.softmax(logits, axis=-1)

    def expert_probabilities(self, scores: Tensor) -> Tensor:
        """The scores [G, S, E] as a distribution over experts.

        The softmax already is one; sigmoid scores are divided by their sum
        over experts. The load-balancing loss takes its `P_e` from these (as
        DeepSeek-V3's sequence-wise balance loss does), so the loss keeps its
        meaning and its minimum under sigmoid scores.

        Example:
        >>> import numpy as np
        >>> router = Router(num_experts=2, score_function="sigmoid")
        >>> np.asarray(router.expert_probabilities(np.array([[[0.6, 0.2]]], "float32"))).round(2)
        array([[[0.75, 0.25]]], dtype=float32)
        """
        if self.score_function == "sigmoid":
            return scores / ops.maximum(ops.sum(scores, axis=-1, keepdims=True), 1e-9)
        return scores

    def assign(
        self,
        probs: Tensor,
        token_mask: Tensor,
        capacity: int | Tensor,
        training: bool | None,
        group_capacity: Tensor | None = None,
    ) -> AssignResult:
        """The routing decision of scores [G, S, E] and a float mask [G, S].

        `probs` are the router's scores (`scores()`: probabilities under the
        softmax, per-expert sigmoids otherwise); `expert_probabilities(probs)`
        gives them as a distribution over experts.

        `capacity` is the static buffer size per expert; `group_capacity`,
        when given, an int32 [G] of the slots each group may fill (at most
        `capacity`): an assignment whose slot is not below it is not kept.

        Returns:
            `(expert_index, position, kept, combine_weight, aux_loss)`: int
            [G, S, K] experts, [G, S, K] slots in them, float [G, S, K] 1 where
            the assignment holds a slot, float [G, S, K] combine weights (masked
            by `kept` afterwards), and the scalar load-balancing loss.
        """
        raise NotImplementedError

    def get_config(self) -> dict[str, Any]:
        config = super().get_config()
        config.update(
            num_experts=self.num_experts,
            jitter_noise=self.jitter_noise,
            kernel_initializer=keras.initializers.serialize(self.kernel_initializer),
            use_bias=self.use_bias,
            seed=self.seed,
            score_function=self.score_function,
            routed_scaling_factor=self.routed_scaling_factor,
        )
        return config
