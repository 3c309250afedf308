"""MoeLayer: router + dispatch + experts + combine, with groups, capacity, losses, metrics."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

import keras
from keras import ops

from keras_moe import compat
from keras_moe import dispatch as dispatch_lib
from keras_moe import routing as routing_lib
from keras_moe.arguments import BalanceLoss, DispatchMode, check_values
from keras_moe.layers.experts import FeedForwardExperts
from keras_moe.layers.moe_arguments import check_combinations
from keras_moe.layers.token_groups import from_groups, grouping_for, to_groups
from keras_moe.routing import losses as router_losses
from keras_moe.routing import metrics as metrics_lib
from keras_moe.routing.scope import routing_each_sequence
from keras_moe.tensor_types import Shape, Tensor
from keras_moe.validation import check_rank3_inputs, is_int

GroupSize = int | Literal["batch", "sequence"] | None


@keras.saving.register_keras_serializable(package="keras_moe")
class MoeLayer(compat.PerThreadLosses, keras.layers.Layer):
    """A sparsely-activated feed-forward layer (the MoE branch only, no residual).

    Tokens `[batch, length, d_model]` are split into groups (GShard), routed,
    dispatched into expert buffers of fixed capacity, processed by the experts
    and combined back. Tokens dropped for lack of capacity, and padding tokens,
    get an output of exactly 0: put the layer in a residual branch so they pass
    through unchanged. The load-balancing and z losses are added with
    `add_loss`, scaled by their factors, so `model.fit` trains on them.

    Args:
        router: a `keras_moe.routing.Router`.
        experts: a `keras_moe.FeedForwardExperts` with the same `num_experts`.
        group_size: how tokens are grouped for routing (capacity is per group).
            "batch" (default): all tokens of the call (on each replica, or
            each batch shard of a mesh: `keras_moe.parallel.local_groups`) form one
            group, position-major (every sequence's token 0, then
            every token 1, ...), so in a causal layer no token's slot depends
            on a later position. When the batch size is unknown at trace time
            (TensorFlow `fit` on arrays or on a dataset without
            `drop_remainder`) the capacity is computed at run time, which
            the gather dispatcher supports and einsum does not (it needs
            static shapes, as on TPU). "sequence" (or None): each sequence
            is a group. An integer N: the batch's tokens are flattened and cut
            into groups of N; the token count must be divisible by it unless
            `pad_to_group_size=True`. Whatever the setting, one-token calls
            (cached decoding) route each token alone, and with
            `independent_routing` no group holds tokens of two sequences.
        pad_to_group_size: pad the tokens up to a multiple of `group_size` with
            masked padding instead of raising.
        train_capacity_factor: capacity factor in training, > 0. A group's
            capacity counts its real tokens, not its padding (the buffers keep
            the padded size), so an input routes the same whatever width it
            is padded to (`real_token_capacity`).
        eval_capacity_factor: capacity factor in inference, > 0.
        min_expert_capacity: lower bound on slots per expert per group, >= 0.
        dispatch: "auto" (einsum on TPU, gather elsewhere), "einsum", "gather",
            or "dropless": no capacity, nothing dropped, each expert computes
            exactly its tokens (token-choice routers; not on TPU or under XLA;
            the capacity factors are then unused). With the experts split over
            a JAX mesh's "expert" axis, rows travel to their experts' devices
            (`keras_moe.dispatch.dropless_exchange`).
        dropless_buffer_factor: with dispatch="dropless" and experts split
            over a mesh: each device's receive buffer in multiples of its own
            token-expert assignments; rows past it are dropped and counted in
            `dropped_fraction`. None (default): the worst case, nothing dropped.
        aux_loss_factor: weight of the load-balancing loss, >= 0 (Switch: 1e-2).
        balance_loss: which load-balancing loss `aux_loss_factor` weighs
            (`keras_moe.arguments.BALANCE_LOSSES`): "group" (default,
            Switch/GShard: per routing group, first choices), "sequence"
            (DeepSeek: per sequence, all k choices) or "global" (all k choices
            of the global batch, counted over every replica / mesh shard).
            "sequence" and "global" need a token-choice router.
        shared_experts: optional always-on layer `[B, L, d] -> [B, L, d]`
            (a `keras_moe.SharedExpertFeedForward`) whose output is added to
            the routed experts' for every real token.
        z_loss_factor: weight of the router z-loss, >= 0 (ST-MoE: 1e-3).
        losses_in_inference: add the balance and z losses in inference calls
            too (True, so `evaluate` reports the loss `fit` minimises); False:
            only when training (as keras-hub's and HF's MoE blocks do).
        causal: True for layers in a causal decoder; refuses routers that look
            at future tokens (expert choice, batch-prioritised routing).
        track_metrics: keep Keras `Mean` trackers of the router statistics,
            reported by `fit` and `evaluate` as `<metrics_prefix>/<statistic>`.
            In a model with `keras_moe.RouterMetricsMixin` (as `EncoderDecoder`)
            the model updates them, on every backend; elsewhere the layer
            updates them in `call`, which only TensorFlow's `fit` keeps (on JAX
            they are left out of the logs, with a warning).
        return_metrics: the default of `call`'s `return_metrics`: return
            `(outputs, metrics_dict)` instead of `outputs`
            (`keras_moe.router_metrics`' statistics, its `num_tokens` included).
        metrics_prefix: prefix of the metric names (`<prefix>/dropped_fraction`,
            ...); defaults to the layer name. Give each MoE layer of a model its
            own prefix so their metrics stay apart.

    Example:
    >>> import numpy as np
    >>> import keras_moe
    >>> layer = MoeLayer(
    ...     keras_moe.SwitchRouter(num_experts=4),
    ...     keras_moe.FeedForwardExperts(num_experts=4, d_ff=32),
    ... )
    >>> y = layer(np.random.rand(2, 8, 16).astype("float32"))
    >>> tuple(y.shape)
    (2, 8, 16)
    """

    def __init__(
        self,
        router: routing_lib.Router | dict[str, Any],
        experts: FeedForwardExperts | dict[str, Any],
        group_size: GroupSize = "batch",
        pad_to_group_size: bool = False,
        train_capacity_factor: float = 1.25,
        eval_capacity_factor: float = 2.0,
        min_expert_capacity: int = 4,
        dispatch: DispatchMode = "auto",
        aux_loss_factor: float = 1e-2,
        z_loss_factor: float = 1e-3,
        causal: bool = False,
        track_metrics: bool = True,
        return_metrics: bool = False,
        metrics_prefix: str | None = None,
        dropless_buffer_factor: float | None = None,
        balance_loss: BalanceLoss = "group",
        shared_experts: keras.layers.Layer | dict[str, Any] | None = None,
        losses_in_inference: bool = True,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        if isinstance(router, dict):
            router = keras.saving.deserialize_keras_object(router)
        if isinstance(experts, dict):
            experts = keras.saving.deserialize_keras_object(experts)
        if isinstance(shared_experts, dict):
            shared_experts = keras.saving.deserialize_keras_object(shared_experts)
        if shared_experts is not None and not isinstance(shared_experts, keras.layers.Layer):
            raise ValueError(
                "`shared_experts` must be a Keras layer (a SharedExpertFeedForward) "
                f"or None, got {type(shared_experts).__name__}."
            )
        if not isinstance(router, routing_lib.Router):
            raise ValueError(f"`router` must be a keras_moe Router, got {type(router).__name__}.")
        if not isinstance(experts, FeedForwardExperts):
            raise ValueError(
                f"`experts` must be a FeedForwardExperts layer, got {type(experts).__name__}."
            )
        if group_size is None:
            group_size = "sequence"
        MoeLayer.check_arguments(
            dict(
                router=router,
                experts=experts,
                group_size=group_size,
                train_capacity_factor=train_capacity_factor,
                eval_capacity_factor=eval_capacity_factor,
                min_expert_capacity=min_expert_capacity,
                dispatch=dispatch,
                aux_loss_factor=aux_loss_factor,
                z_loss_factor=z_loss_factor,
                dropless_buffer_factor=dropless_buffer_factor,
                balance_loss=balance_loss,
                causal=causal,
            )
        )
        self.dispatcher = dispatch_lib.get_dispatcher(dispatch, dropless_buffer_factor)
        self.dropless_buffer_factor = dropless_buffer_factor
        self.dispatcher.check(router, experts)
        self.router = router
        self.experts = experts
        self.shared_experts = shared_experts
        self.balance_loss = balance_loss
        self.num_experts = router.num_experts
        self.group_size = group_size
        self.pad_to_group_size = bool(pad_to_group_size)
        self.train_capacity_factor = float(train_capacity_factor)
        self.eval_capacity_factor = float(eval_capacity_factor)
        self.min_expert_capacity = min_expert_capacity
        self.dispatch = dispatch
        self.aux_loss_factor = float(aux_loss_factor)
        self.z_loss_factor = float(z_loss_factor)
        self.losses_in_inference = bool(losses_in_inference)
        self.causal = bool(causal)
        self.track_metrics = bool(track_metrics)
        self.return_metrics = bool(return_metrics)
        self.metrics_prefix = metrics_prefix
        self.supports_masking = True
        self._trackers = None
        if self.track_metrics:
            self._trackers = metrics_lib.make_metric_trackers(metrics_prefix or self.name)

    @classmethod
    def check_arguments(cls, arguments: Mapping[str, Any]) -> None:
        """Checks arguments of this class's constructor by value and builds nothing:
        the one validator behind the constructor and a model's sparse-FFN spec.

        Args:
            arguments: some of the constructor's arguments (the others take
                their defaults), `causal` included; `router` and `experts` as
                layers or as their configs.

        Raises:
            ValueError: naming the argument and what is allowed.

        Example:
        >>> MoeLayer.check_arguments({"train_capacity_factor": 0})
        Traceback (most recent call last):
        ...
        ValueError: `train_capacity_factor` must be a number > 0, got 0.
        """
        check_values(arguments)
        for part in ("router", "experts", "shared_experts"):
            value = arguments.get(part)
            if isinstance(value, Mapping) and isinstance(value.get("config"), Mapping):
                check_values(value["config"])
        check_combinations(arguments, getattr(cls, "router_class", None))

    @property
    def metrics(self) -> list:
        return metrics_lib.reported_metrics(self, super().metrics)

    def build(self, input_shape: Shape) -> None:
        check_rank3_inputs(self, input_shape)
        d_model = input_shape[-1]
        if not self.router.built:
            self.router.build((None, None, d_model))
        if not self.experts.built:
            self.experts.build((self.num_experts, None, None, d_model))
        if self.shared_experts is not None and not self.shared_experts.built:
            self.shared_experts.build((None, None, d_model))
        self.built = True

    def capacity(self, group_size: int | Tensor, training: bool | None) -> int | Tensor:
        """Slots per expert per group for a group of `group_size` tokens."""
        factor = self.train_capacity_factor if training else self.eval_capacity_factor
        return self.dispatcher.expert_capacity(
            self.router, group_size, factor, self.min_expert_capacity
        )

    def real_token_capacity(
        self, group_mask: Tensor, group_size: int | Tensor, training: bool | None
    ) -> Tensor:
        """int32 [G]: each group's capacity counted from its real tokens.

        The expert buffers keep the size `capacity(group_size)` gives, but a
        group may fill only as many slots per expert as its real (unmasked)
        tokens give, so padding never adds capacity: a sequence routes the
        same alone, padded, or beside a longer one. Without padding this is
        `capacity(group_size)` itself.

        Example:
        >>> import numpy as np
        >>> import keras_moe
        >>> layer = keras_moe.SwitchFeedForward(num_experts=4, d_ff=8, eval_capacity_factor=1.0,
        ...                                     min_expert_capacity=1)
        >>> mask = np.array([[1.0] * 16, [1.0] * 6 + [0.0] * 10])  # 16 and 6 real tokens
        >>> np.asarray(layer.real_token_capacity(mask, 16, training=False)).tolist()
        [4, 2]
        """
        counts = ops.cast(ops.sum(ops.cast(group_mask, "float32"), axis=1), "int32")
        if is_int(group_size):  # exactly the Python formula, one entry per token count
            table = [self.capacity(n, training) for n in range(int(group_size) + 1)]
            return ops.take(ops.convert_to_tensor(table, "int32"), counts)
        return self.capacity(counts, training)

    def call(
        self,
        inputs: Tensor,
        mask: Tensor | None = None,
        training: bool | None = None,
        independent_routing: bool | None = None,
        return_metrics: bool | None = None,
    ) -> Tensor | tuple[Tensor, dict[str, Tensor]]:
        """Outputs `[batch, length, d_model]` (and the metrics with `return_metrics`).

        Args:
            inputs: `[batch, length, d_model]`.
            mask: optional `[batch, length]`, 0 (False) for padding.
            training: whether the layer is training.
            independent_routing: True: route each sequence apart from the
                rest of the batch (`group_size="batch"` becomes one group per
                sequence, an integer N cuts each sequence into groups of N), as
                decoding and serving do; False: the layer's `group_size`; None
                (default): True only inside this thread's `route_each_sequence()`.
            return_metrics: True: return `(outputs, metrics_dict)`; None: the
                constructor's `return_metrics`.
        """
        check_rank3_inputs(self, inputs)
        if return_metrics is None:
            return_metrics = self.return_metrics
        if independent_routing is None:
            independent_routing = routing_each_sequence()
        input_shape = ops.shape(inputs)
        if mask is None:
            token_mask = ops.ones(input_shape[:-1], "float32")
        else:
            token_mask = ops.cast(mask, "float32")
        grouping = grouping_for(inputs, self.group_size, independent_routing)
        groups, group_mask, pad = to_groups(inputs, token_mask, grouping, self.pad_to_group_size)
        group_size = groups.shape[1]
        if group_size is None:  # "batch" groups of a batch of unknown size
            group_size = ops.shape(groups)[1]
        capacity = self.capacity(group_size, training)
        group_capacity = None
        if (mask is not None or pad) and self.dispatcher.drops_tokens:
            group_capacity = self.real_token_capacity(group_mask, group_size, training)

        logits = self.router(groups, training=training)
        routing = self.router.route(
            logits, group_mask, capacity, training=bool(training), group_capacity=group_capacity
        )
        if self.balance_loss != "group":
            routing = routing._replace(
                aux_loss=self._balance_loss(routing, group_mask, inputs, token_mask, grouping, pad)
            )
        adds_losses = bool(training) or self.losses_in_inference
        if self.aux_loss_factor and adds_losses:
            self.add_loss(self.aux_loss_factor * routing.aux_loss)
        if self.z_loss_factor and adds_losses:
            self.add_loss(self.z_loss_factor * routing.z_loss)

        outputs, kept = self.dispatcher.apply_and_report(groups, routing, self.experts, training)
        if kept is not routing.kept:  # the dispatcher dropped some: the metrics count them
            routing = routing._replace(kept=kept)

        outputs = from_groups(outputs, inputs, grouping, pad)
        outputs = ops.cast(outputs, self.compute_dtype)
        if self.shared_experts is not None:  # padding keeps its output of 0
            shared = self.shared_experts(inputs, training=training)
            outputs = (
                outputs
                + ops.cast(shared, outputs.dtype) * ops.cast(token_mask, outputs.dtype)[..., None]
            )

        stats = None
        if self._trackers is not None or return_metrics:
            stats = metrics_lib.router_metrics(routing, group_mask)
            stats["output_rms_ratio"] = metrics_lib.branch_rms_ratio(inputs, outputs, token_mask)
        if self._trackers is not None:
            assert stats is not None  # computed above whenever there are trackers
            metrics_lib.track_layer_stats(self, self._trackers, stats, warn=not return_metrics)
        if return_metrics:
            return outputs, stats
        return outputs

    def _balance_loss(self, routing, group_mask, inputs, token_mask, grouping, pad):
        """The "sequence" or "global" balance loss of one call's routing."""
        counts = router_losses.choice_counts(
            routing.expert_index, routing.selected, self.num_experts
        )
        if self.balance_loss == "global":
            return router_losses.global_balance_loss(routing.router_probs, counts, group_mask)
        per_token = ops.concatenate([routing.router_probs, counts], axis=-1)
        per_token = from_groups(per_token, inputs, grouping, pad)  # [B, L, 2E]
        return router_losses.sequence_balance_loss(
            per_token[..., : self.num_experts], per_token[..., self.num_experts :], token_mask
        )

    def compute_mask(self, inputs: Tensor, mask: Tensor | None = None) -> Tensor | None:
        return mask

    def compute_output_spec(
        self,
        inputs: keras.KerasTensor,
        mask: Tensor | None = None,
        training: bool | None = None,
        independent_routing: bool | None = None,
        return_metrics: bool | None = None,
    ) -> keras.KerasTensor | tuple[keras.KerasTensor, dict[str, keras.KerasTensor]]:
        check_rank3_inputs(self, inputs)
        output = keras.KerasTensor(inputs.shape, dtype=self.compute_dtype)
        if return_metrics is None:
            return_metrics = self.return_metrics
        if not return_metrics:
            return output
        stats = metrics_lib.router_metric_specs(self.num_experts)
        return output, stats

    def get_config(self) -> dict[str, Any]:
        config = super().get_config()
        config.update(
            router=keras.saving.serialize_keras_object(self.router),
            experts=keras.saving.serialize_keras_object(self.experts),
            shared_experts=(
                None
                if self.shared_experts is None
                else keras.saving.serialize_keras_object(self.shared_experts)
            ),
            **self._moe_config(),
        )
        return config

    def _moe_config(self):
        return dict(
            group_size=self.group_size,
            pad_to_group_size=self.pad_to_group_size,
            train_capacity_factor=self.train_capacity_factor,
            eval_capacity_factor=self.eval_capacity_factor,
            min_expert_capacity=self.min_expert_capacity,
            dispatch=self.dispatch,
            dropless_buffer_factor=self.dropless_buffer_factor,
            aux_loss_factor=self.aux_loss_factor,
            balance_loss=self.balance_loss,
            z_loss_factor=self.z_loss_factor,
            losses_in_inference=self.losses_in_inference,
            causal=self.causal,
            track_metrics=self.track_metrics,
            return_metrics=self.return_metrics,
            metrics_prefix=self.metrics_prefix,
        )
