"""The ready-made MoE feed-forward layers: Switch (top-1), GShard (top-2) and top-k.

(T5's dense FFN, `DenseFeedForward`, is in `keras_moe.layers.dense_feedforward`.)"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import keras

from keras_moe.arguments import (
    Activation,
    DispatchMode,
    EvalSecondExpertPolicy,
    NormalizeGates,
    RouterDtype,
    ScoreFunction,
    SecondExpertPolicy,
)

# Re-exported from its old home (the redundant alias marks the re-export).
from keras_moe.layers.dense_feedforward import DenseFeedForward as DenseFeedForward
from keras_moe.layers.experts import FeedForwardExperts
from keras_moe.layers.moe import GroupSize, MoeLayer
from keras_moe.layers.shared_experts import SharedExpertFeedForward
from keras_moe.routing import SwitchRouter, Top2Router, TopKRouter, default_router_initializer
from keras_moe.routing.token_choice import TokenChoiceRouter
from keras_moe.validation import is_int


class _ExpertFeedForward(MoeLayer):
    """The ready-made layers' shared constructor: a router of `router_class`
    (the hook: subclasses name their router class and pass its own arguments
    as `router_args`) and `FeedForwardExperts`, from plain arguments."""

    router_class: type[TokenChoiceRouter] | None = None  # set by each ready-made layer
    experts_per_token = 1  # the router's k by default

    def __init__(
        self,
        num_experts: int,
        d_ff: int,
        activation: Activation = "relu",
        train_capacity_factor: float = 1.25,
        eval_capacity_factor: float = 2.0,
        min_expert_capacity: int = 4,
        group_size: GroupSize = "batch",
        jitter_noise: float = 0.0,
        expert_dropout_rate: float = 0.0,
        init_scale: float = 1.0,
        router_init_scale: float | None = None,
        router_bias: bool = False,
        aux_loss_factor: float = 1e-2,
        z_loss_factor: float = 1e-3,
        dispatch: DispatchMode = "auto",
        batch_prioritized_routing: bool = False,
        router_dtype: RouterDtype = "float32",
        seed: int | None = None,
        shared_d_ff: int | None = None,
        shared_expert_gate: bool = False,
        router_args: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        # Every named argument, as given (`__class__` is the cell `super()` reads).
        own = {k: v for k, v in locals().items() if k not in ("self", "kwargs", "__class__")}
        type(self).check_arguments({**own, **(router_args or {}), **kwargs})
        if self.router_class is None:
            raise TypeError(f"{type(self).__name__} names no `router_class`.")
        router = self.router_class(
            num_experts,
            jitter_noise=jitter_noise,
            use_bias=router_bias,
            kernel_initializer=default_router_initializer(
                init_scale if router_init_scale is None else router_init_scale
            ),
            batch_prioritized_routing=batch_prioritized_routing,
            seed=seed,
            name="router",
            dtype=router_dtype,
            **(router_args or {}),
        )
        experts = FeedForwardExperts(
            num_experts=num_experts,
            d_ff=d_ff,
            activation=activation,
            dropout_rate=expert_dropout_rate,
            init_scale=init_scale,
            seed=seed,
            name="experts",
            dtype=kwargs.get("dtype"),
        )
        shared = None
        if shared_d_ff is not None:
            shared = SharedExpertFeedForward(
                d_ff=shared_d_ff,
                activation=activation,
                gate=shared_expert_gate,
                dropout_rate=expert_dropout_rate,
                init_scale=init_scale,
                seed=seed,
                name="shared_experts",
                dtype=kwargs.get("dtype"),
            )
        super().__init__(
            router,
            experts,
            shared_experts=shared,
            train_capacity_factor=train_capacity_factor,
            eval_capacity_factor=eval_capacity_factor,
            min_expert_capacity=min_expert_capacity,
            group_size=group_size,
            aux_loss_factor=aux_loss_factor,
            z_loss_factor=z_loss_factor,
            dispatch=dispatch,
            **kwargs,
        )
        self.d_ff = d_ff
        self.shared_d_ff = shared_d_ff
        self.activation = activation
        self.expert_dropout_rate = expert_dropout_rate
        self.init_scale = init_scale
        self.router_init_scale = router_init_scale
        self.seed = seed

    @classmethod
    def check_arguments(cls, arguments: Mapping[str, Any]) -> None:
        """As `MoeLayer.check_arguments`, with this layer's own: enough experts for
        its router's experts per token, and a shared expert for its gate."""
        super().check_arguments(arguments)
        per_token = arguments.get("k", cls.experts_per_token)
        num_experts = arguments.get("num_experts")
        if is_int(num_experts) and is_int(per_token) and num_experts < per_token:
            raise ValueError(
                f"`num_experts` must be an integer >= {per_token} ({per_token} experts "
                f"per token), got {num_experts}."
            )
        if arguments.get("shared_expert_gate") and arguments.get("shared_d_ff") is None:
            raise ValueError("`shared_expert_gate=True` needs a shared expert: give `shared_d_ff`.")

    def get_config(self) -> dict[str, Any]:
        # MoeLayer's config holds the router and experts as objects; these
        # layers rebuild them from plain arguments instead.
        config = keras.layers.Layer.get_config(self)
        config.update(self._moe_config())
        config.update(
            num_experts=self.num_experts,
            d_ff=self.d_ff,
            shared_d_ff=self.shared_d_ff,
            shared_expert_gate=bool(self.shared_experts is not None and self.shared_experts.gate),
            activation=self.activation,
            expert_dropout_rate=self.expert_dropout_rate,
            init_scale=self.init_scale,
            router_init_scale=self.router_init_scale,
            router_bias=self.router.use_bias,
            seed=self.seed,
            jitter_noise=self.router.jitter_noise,
            batch_prioritized_routing=self.router.batch_prioritized_routing,
            router_dtype=self.router.dtype_policy.name,
        )
        return config


@keras.saving.register_keras_serializable(package="keras_moe")
class SwitchFeedForward(_ExpertFeedForward):
    """Switch Transformer feed-forward layer: top-1 routing to `num_experts` FFNs.

    A drop-in replacement for a Transformer's dense FFN block (without the
    residual): `[batch, length, d_model] -> [batch, length, d_model]`.

    Args:
        num_experts: number of experts.
        d_ff: hidden size of each expert.
        activation: expert activation ("relu", "gelu", "gated-gelu", ...).
        train_capacity_factor: capacity factor in training (paper: 1.0-1.25).
        eval_capacity_factor: capacity factor in inference (paper: 2.0).
        min_expert_capacity: lower bound on slots per expert per group.
        group_size: routing groups: "batch" (all tokens of the call, position-
            major), "sequence" (each sequence alone) or a token count (see
            `MoeLayer`).
        jitter_noise: router input jitter in training (paper: 1e-2), 0 disables.
        expert_dropout_rate: dropout inside the experts.
        init_scale: variance scale of the experts' fan-in init. 1.0 (default)
            matches T5's and Keras' usual fan-in scale, so the MoE branch is as
            loud as the layers around it; the Switch paper uses 0.1 for *every*
            weight of the model, which keras_moe's T5 models do with
            `T5Config(init_scale=0.1)`. In the T5 models, 0.1 for the experts
            and router alone left the MoE branch ~0.001 of the residual
            stream, with gradients under Adam's epsilon.
        router_init_scale: the router's init scale; None follows `init_scale`.
        router_bias: add a bias to the router logits (HF's `router_bias`).
        aux_loss_factor: load-balancing loss weight (paper: 1e-2).
        z_loss_factor: router z-loss weight (ST-MoE: 1e-3).
        dispatch: "auto", "einsum", "gather" or "dropless" (see `MoeLayer`).
        batch_prioritized_routing: fill capacity by router confidence.
        router_dtype: dtype policy of the router; "float32" (the Switch
            paper's selective precision) unless you are studying instability.
        seed: seed for jitter and dropout.
        shared_d_ff: hidden size of an always-on shared expert beside the
            routed ones (`SharedExpertFeedForward`, same activation); None
            (default): no shared expert.
        shared_expert_gate: gate the shared expert's output per token by a
            sigmoid (Qwen2-MoE); needs `shared_d_ff`.
        **kwargs: the other `MoeLayer` arguments (`causal`, `pad_to_group_size`,
            `track_metrics`, ...) and Keras layer arguments.

    Example:
    >>> import numpy as np
    >>> import keras_moe
    >>> layer = keras_moe.SwitchFeedForward(num_experts=8, d_ff=64,
    ...     train_capacity_factor=1.25, eval_capacity_factor=2.0)
    >>> y = layer(np.random.rand(2, 16, 32).astype("float32"))
    >>> tuple(y.shape)
    (2, 16, 32)
    """

    router_class = SwitchRouter


@keras.saving.register_keras_serializable(package="keras_moe")
class GShardFeedForward(_ExpertFeedForward):
    """GShard feed-forward layer: top-2 routing with GShard's second-expert policy.

    Capacity is `ceil(cf * 2 * S / E)` slots per expert, so the default
    `train_capacity_factor=1.0` is GShard's `2N/E`.

    Args:
        num_experts: number of experts, >= 2.
        d_ff: hidden size of each expert.
        second_expert_policy: "random" (GShard), "all" or "threshold".
        eval_second_expert_policy: "all" or "threshold".
        second_expert_threshold: threshold of the policy (see `Top2Router`).
        normalize_gates: "before_capacity" (GShard) or "after_capacity".
        **kwargs: as for `SwitchFeedForward`.

    Example:
    >>> import numpy as np
    >>> import keras_moe
    >>> layer = keras_moe.GShardFeedForward(num_experts=8, d_ff=64)
    >>> y = layer(np.random.rand(2, 16, 32).astype("float32"))
    >>> tuple(y.shape), layer.router.num_choices()  # top-2: two experts per token
    ((2, 16, 32), 2)
    """

    router_class = Top2Router
    experts_per_token = 2

    def __init__(
        self,
        num_experts: int,
        d_ff: int,
        activation: Activation = "relu",
        second_expert_policy: SecondExpertPolicy = "random",
        eval_second_expert_policy: EvalSecondExpertPolicy = "all",
        second_expert_threshold: float | None = None,
        normalize_gates: NormalizeGates = "before_capacity",
        train_capacity_factor: float = 1.0,
        **kwargs: Any,
    ) -> None:
        super().__init__(
            num_experts,
            d_ff,
            activation,
            train_capacity_factor=train_capacity_factor,
            router_args=dict(
                second_expert_policy=second_expert_policy,
                eval_second_expert_policy=eval_second_expert_policy,
                second_expert_threshold=second_expert_threshold,
                normalize_gates=normalize_gates,
            ),
            **kwargs,
        )

    def get_config(self) -> dict[str, Any]:
        config = super().get_config()
        config.update(
            second_expert_policy=self.router.second_expert_policy,
            eval_second_expert_policy=self.router.eval_second_expert_policy,
            second_expert_threshold=self.router.second_expert_threshold,
            normalize_gates=self.router.normalize_gates,
        )
        return config


@keras.saving.register_keras_serializable(package="keras_moe")
class TopKFeedForward(_ExpertFeedForward):
    """Top-k feed-forward layer: each token's k best experts, today's fine-grained recipe.

    Many narrow experts with k > 2 (OLMoE: 64 experts top-8; DeepSeek-V3: 256
    top-8 with sigmoid scores and groups), optionally beside a shared expert
    (`shared_d_ff`), with loss-free bias balancing (`selection_bias`,
    `bias_update_rate`) and a balance loss over groups, sequences or the
    global batch (`balance_loss`). The router is a `TopKRouter`; every one of
    its arguments is reachable from here (and from gin).

    Args:
        num_experts: number of experts.
        d_ff: hidden size of each expert (fine-grained: a fraction of the
            dense d_ff, e.g. `d_ff / 4` with `k = 4` for a dense FFN's FLOPs).
        k: experts per token.
        normalize_top_k: renormalise the k weights to sum to 1 (HF's `norm_topk_prob`).
        score_function: "softmax" or "sigmoid".
        routed_scaling_factor: multiplies the routed experts' weights.
        n_group, topk_group: group-limited selection (see `TopKRouter`).
        selection_bias, bias_update_rate: loss-free balancing (see `TopKRouter`).
        train_capacity_factor: capacity factor in training; capacity is
            `ceil(cf * k * S / E)` slots per expert.
        **kwargs: as for `SwitchFeedForward` (`shared_d_ff`,
            `shared_expert_gate`, `dispatch`, `aux_loss_factor`, ...) and
            the other `MoeLayer` arguments (`balance_loss`, ...).

    Example (32 quarter-width experts, top-4, one shared expert, loss-free balancing):
    >>> import numpy as np
    >>> layer = TopKFeedForward(num_experts=32, d_ff=16, k=4, shared_d_ff=16,
    ...                         selection_bias=True, bias_update_rate=1e-3, aux_loss_factor=0.0)
    >>> y = layer(np.random.rand(2, 16, 32).astype("float32"), training=True)
    >>> tuple(y.shape), int(np.sum(np.asarray(layer.router.expert_bias) != 0)) > 0
    ((2, 16, 32), True)
    """

    router_class = TopKRouter
    experts_per_token = 2  # `k`'s default
    _ROUTER_ARGS = (
        "k",
        "normalize_top_k",
        "score_function",
        "routed_scaling_factor",
        "n_group",
        "topk_group",
        "selection_bias",
        "bias_update_rate",
    )

    def __init__(
        self,
        num_experts: int,
        d_ff: int,
        k: int = 2,
        normalize_top_k: bool = False,
        score_function: ScoreFunction = "softmax",
        routed_scaling_factor: float = 1.0,
        n_group: int = 1,
        topk_group: int | None = None,
        selection_bias: bool = False,
        bias_update_rate: float = 0.0,
        activation: Activation = "relu",
        **kwargs: Any,
    ) -> None:
        super().__init__(
            num_experts,
            d_ff,
            activation,
            router_args=dict(
                k=k,
                normalize_top_k=normalize_top_k,
                score_function=score_function,
                routed_scaling_factor=routed_scaling_factor,
                n_group=n_group,
                topk_group=topk_group,
                selection_bias=selection_bias,
                bias_update_rate=bias_update_rate,
            ),
            **kwargs,
        )

    def get_config(self) -> dict[str, Any]:
        config = super().get_config()
        config.update({name: getattr(self.router, name) for name in self._ROUTER_ARGS})
        return config
