"""Router statistics: what fraction was dropped, how load is spread, how sure the router is.

`router_metrics` computes them for one call; the `Mean` trackers of an MoE
layer (`make_metric_trackers`) and `RouterMetricsMixin` bring them into
`fit`'s and `evaluate`'s logs.
"""

from __future__ import annotations

import warnings
import weakref
from typing import TYPE_CHECKING, Any

import keras
from keras import ops
from keras.src.backend import get_stateless_scope

from keras_moe import compat
from keras_moe.mixin_bases import ModelMixinBase
from keras_moe.routing import losses as router_losses
from keras_moe.tensor_types import Tensor

if TYPE_CHECKING:
    from keras_moe.routing import RoutingInstructions

SCALAR_METRICS = (
    "dropped_fraction",
    "router_confidence",
    "router_entropy",
    "load_imbalance",
    "max_violation",
    "aux_loss",
    "z_loss",
    "output_rms_ratio",
)


def router_metrics(routing: RoutingInstructions, token_mask: Tensor) -> dict[str, Tensor]:
    """Router statistics over the real (unpadded) tokens of one call.

    Args:
        routing: `RoutingInstructions`.
        token_mask: [G, S] 1 for real tokens.

    Returns:
        dict of float32 tensors:
        - dropped_fraction: fraction of tokens routed to no expert;
        - expert_load [E]: fraction of the tokens whose first choice (highest
          router probability) is each expert, before capacity is applied, so
          overload shows even where capacity cuts it off;
        - load_imbalance: max expert load times E (1.0 is perfectly balanced);
        - selection_load [E]: each expert's share of all selected choices
          (every k of a token) before capacity; the same as `expert_load`
          for top-1 routing;
        - max_violation: MaxVio (Wang et al., arXiv 2408.15664), max over
          experts of the selections an expert got over their mean, minus 1,
          counting every selected choice (all k of a token) before capacity;
          0 is perfectly balanced;
        - router_confidence: mean top-1 router probability;
        - router_entropy: mean entropy of the router distribution (nats);
        - aux_loss, z_loss: the unscaled losses;
        - num_tokens: how many real tokens the statistics are over.
        A call without real tokens (an empty batch, as a replica may get under
        tf.distribute, or only padding) reports 0 for every statistic.

    Example:
    >>> import numpy as np
    >>> import keras_moe
    >>> router = keras_moe.SwitchRouter(num_experts=2)
    >>> logits = np.array([[[3.0, 0.0], [2.0, 0.0], [1.0, 0.0], [0.0, 5.0]]], "float32")
    >>> routing = router.route(logits, np.ones((1, 4)), capacity=1)
    >>> stats = router_metrics(routing, np.ones((1, 4)))
    >>> [round(float(stats[k]), 2) for k in ("dropped_fraction", "load_imbalance", "max_violation")]
    [0.5, 1.5, 0.5]
    """
    mask = ops.cast(token_mask, "float32")
    num_tokens = ops.sum(mask)
    divisor = ops.maximum(num_tokens, 1.0)
    routed = ops.cast(ops.sum(routing.kept, axis=-1) > 0, "float32") * mask
    dropped = (num_tokens - ops.sum(routed)) / divisor
    probs = routing.router_probs
    first_choice = ops.one_hot(ops.argmax(probs, axis=-1), routing.num_experts, dtype="float32")
    load = ops.sum(first_choice * mask[..., None], axis=(0, 1)) / divisor
    # `initial`: Keras' TensorFlow `max` raises on an empty tensor in eager mode.
    confidence = ops.sum(ops.max(probs, axis=-1, initial=0.0) * mask) / divisor
    entropy_per_token = -ops.sum(probs * ops.log(ops.maximum(probs, 1e-9)), axis=-1)
    entropy = ops.sum(entropy_per_token * mask) / divisor
    selected = routing.selected if routing.selected is not None else routing.kept
    counts = ops.sum(
        router_losses.choice_counts(
            routing.expert_index,
            ops.cast(selected, "float32") * mask[..., None],
            routing.num_experts,
        ),
        axis=(0, 1),
    )
    total_count = ops.sum(counts)
    mean_count = total_count / routing.num_experts
    max_violation = ops.where(
        mean_count > 0, ops.max(counts) / ops.maximum(mean_count, 1e-9) - 1.0, 0.0
    )
    return {
        "dropped_fraction": dropped,
        "expert_load": load,
        "load_imbalance": ops.max(load) * routing.num_experts,
        "max_violation": max_violation,
        "selection_load": counts / ops.maximum(total_count, 1.0),
        "router_confidence": confidence,
        "router_entropy": entropy,
        "aux_loss": ops.cast(routing.aux_loss, "float32"),
        "z_loss": ops.cast(routing.z_loss, "float32"),
        "num_tokens": num_tokens,
    }


def branch_rms_ratio(inputs: Tensor, outputs: Tensor, token_mask: Tensor) -> Tensor:
    """RMS of the MoE branch's output over the RMS of its input, on real tokens.

    Near 0 the branch adds almost nothing to the residual stream (starved
    experts); a dense FFN branch of a trained T5 sits near 1. 0 without real tokens.

    Args:
        inputs, outputs: [B, L, d] the layer's input and output.
        token_mask: [B, L] 1 for real tokens.

    Example:
    >>> import numpy as np
    >>> x = np.ones((1, 2, 4), "float32")
    >>> round(float(branch_rms_ratio(x, 0.5 * x, np.ones((1, 2)))), 3)
    0.5
    """
    mask = ops.cast(token_mask, "float32")[..., None]

    def mean_square(t):
        return ops.sum(ops.square(ops.cast(t, "float32")) * mask) / ops.maximum(
            ops.sum(mask) * t.shape[-1], 1.0
        )

    return ops.sqrt(mean_square(outputs) / ops.maximum(mean_square(inputs), 1e-12))


def router_metric_specs(num_experts: int) -> dict[str, keras.KerasTensor]:
    """Symbolic shapes of `router_metrics`' outputs (for functional models)."""
    specs = {name: keras.KerasTensor((), dtype="float32") for name in SCALAR_METRICS}
    specs["expert_load"] = keras.KerasTensor((num_experts,), dtype="float32")
    specs["selection_load"] = keras.KerasTensor((num_experts,), dtype="float32")
    specs["num_tokens"] = keras.KerasTensor((), dtype="float32")
    return specs


def make_metric_trackers(layer_name: str) -> dict[str, keras.metrics.Mean]:
    """Keras `Mean` trackers of the scalar router statistics of one MoE layer.

    Assigned to a layer attribute, they show up in `model.metrics`, the `fit`
    history, the progress bar and TensorBoard as `<layer name>/<statistic>`.
    """
    return {name: keras.metrics.Mean(name=f"{layer_name}/{name}") for name in SCALAR_METRICS}


def update_metric_trackers(
    trackers: dict[str, keras.metrics.Mean], stats: dict[str, Tensor]
) -> None:
    """Adds one call's `router_metrics` to the trackers' running means.

    Each call with real tokens counts once; a call without any (an empty
    replica batch under tf.distribute) does not count, so it leaves the means
    unchanged instead of pulling them toward 0.
    """
    weight = None
    if "num_tokens" in stats:
        weight = ops.cast(stats["num_tokens"] > 0, "float32")
    for name, tracker in trackers.items():
        tracker.update_state(stats[name], sample_weight=weight)


def hold_router_stats(layer: keras.layers.Layer, stats: dict[str, Tensor] | None) -> None:
    """Keeps `stats` of `layer`'s latest call for its model to aggregate.

    Stored outside Keras' attribute tracking: the tensors belong to one trace.
    """
    object.__setattr__(layer, "_pending_router_stats", stats)


def update_router_trackers(model: keras.Model) -> None:
    """Adds each MoE layer's latest held statistics to its metric trackers.

    Called by `RouterMetricsMixin.compute_loss`, which runs in the same trace as
    the forward pass and, on JAX, where the trainer maps the metric variables.
    Each held statistic is used once.

    Args:
        model: a Keras model whose MoE layers were claimed by `claim_router_metrics`.
    """

    for layer in compat.sublayers(model):
        stats = getattr(layer, "_pending_router_stats", None)
        trackers = getattr(layer, "_trackers", None)
        if stats is None or not trackers:
            continue
        hold_router_stats(layer, None)
        stats = {name: ops.stop_gradient(value) for name, value in stats.items()}
        update_metric_trackers(trackers, stats)


def claim_router_metrics(model: keras.Model) -> None:
    """Marks `model`'s MoE layers so that they hold their statistics for the model
    instead of updating their trackers inside `call`."""

    for layer in compat.sublayers(model):
        if getattr(layer, "_trackers", None):
            object.__setattr__(layer, "_router_metrics_claimed", True)


class RouterMetricsMixin(ModelMixinBase):
    """Puts the MoE layers' router statistics (`track_metrics=True`) in `fit`'s
    and `evaluate`'s logs on every backend.

    The layers hold each call's statistics and the model adds them to the
    layers' `Mean` trackers in `compute_loss`, outside the layers' `call`
    (a tracker updated inside `call` is lost under JAX's stateless `fit`).
    `EncoderDecoder` uses it; mix it in before `keras.Model` in your own model.

    Example:
    >>> import keras
    >>> import numpy as np
    >>> import keras_moe
    >>> class Model(RouterMetricsMixin, keras.Model):
    ...     def __init__(self):
    ...         super().__init__()
    ...         self.moe = keras_moe.SwitchFeedForward(num_experts=2, d_ff=8, name="moe")
    ...     def call(self, x, training=None):
    ...         return x + self.moe(x, training=training)
    >>> model = Model()
    >>> model.compile("sgd", "mse")
    >>> x = np.ones((4, 3, 8), "float32")
    >>> history = model.fit(x, x, epochs=1, verbose=0).history
    >>> "moe/dropped_fraction" in history
    True
    """

    def compile(self, *args: Any, **kwargs: Any) -> None:
        claim_router_metrics(self)
        return super().compile(*args, **kwargs)

    def compute_loss(
        self,
        x: Any = None,
        y: Any = None,
        y_pred: Any = None,
        sample_weight: Any = None,
        training: bool = True,
    ) -> Tensor:
        update_router_trackers(self)
        return super().compute_loss(
            x=x, y=y, y_pred=y_pred, sample_weight=sample_weight, training=training
        )


_JAX_WARNED: weakref.WeakSet = weakref.WeakSet()  # layers that warned


def trackers_reach_logs(layer: keras.layers.Layer) -> bool:
    """Whether `layer`'s router trackers are updated where `fit` and `evaluate` keep
    the update: on TensorFlow, or when a `RouterMetricsMixin` model claimed the layer."""
    return keras.backend.backend() == "tensorflow" or getattr(
        layer, "_router_metrics_claimed", False
    )


def reported_metrics(layer: keras.layers.Layer, metrics: list) -> list:
    """`layer`'s Keras `metrics` without its router trackers where they would not be
    updated (`trackers_reach_logs`): a statistic that was not measured must not show
    up in the logs as 0."""
    trackers = getattr(layer, "_trackers", None)
    if not trackers or trackers_reach_logs(layer):
        return metrics
    own = {id(tracker) for tracker in trackers.values()}
    return [metric for metric in metrics if id(metric) not in own]


def track_layer_stats(
    layer: keras.layers.Layer,
    trackers: dict[str, keras.metrics.Mean],
    stats: dict[str, Tensor],
    warn: bool = True,
) -> None:
    """Routes one call's statistics of an MoE layer to its trackers.

    A layer claimed by its model (`RouterMetricsMixin`) holds them for the
    model's `compute_loss`; otherwise they update the trackers here, except in
    a JAX stateless trace, which would drop the update (in `fit` it warns once).
    """
    if getattr(layer, "_router_metrics_claimed", False):
        hold_router_stats(layer, stats)
        return
    if keras.backend.backend() != "tensorflow":
        scope = get_stateless_scope()
        if scope is not None:  # a trace whose variable updates the layer cannot keep
            if warn and scope.collect_losses and layer not in _JAX_WARNED:
                _JAX_WARNED.add(layer)
                warnings.warn(
                    f"MoE layer '{layer.name}': its router metrics cannot be measured from "
                    f"inside the layer on the {keras.backend.backend()} backend's `fit` and "
                    "`evaluate`, so they are left out of the logs. To get them, build the "
                    "model from a class with `keras_moe.RouterMetricsMixin` before "
                    "keras.Model (a functional model too: `class Model(keras_moe."
                    "RouterMetricsMixin, keras.Model): pass`, then `Model(inputs, outputs)`), "
                    "or call the layer with `return_metrics=True`.",
                    stacklevel=2,
                )
            return
    update_metric_trackers(trackers, stats)
