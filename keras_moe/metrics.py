"""Router statistics: what fraction was dropped, how load is spread, how sure the router is."""

import keras
from keras import ops

SCALAR_METRICS = (
    "dropped_fraction",
    "router_confidence",
    "router_entropy",
    "load_imbalance",
    "aux_loss",
    "z_loss",
)


def router_metrics(routing, token_mask):
    """Router statistics over the real (unpadded) tokens of one call.

    Args:
        routing: `RoutingInstructions`.
        token_mask: [G, S] 1 for real tokens.

    Returns:
        dict of float32 tensors:
        - dropped_fraction: fraction of tokens routed to no expert;
        - expert_load [E]: fraction of the dispatched assignments each expert got;
        - load_imbalance: max expert load times E (1.0 is perfectly balanced);
        - router_confidence: mean top-1 router probability;
        - router_entropy: mean entropy of the router distribution (nats);
        - aux_loss, z_loss: the unscaled losses.

    Example:
    >>> stats = router_metrics(routing, np.ones((1, 8)))
    >>> sorted(stats)[:2]
    ['aux_loss', 'dropped_fraction']
    """
    mask = ops.cast(token_mask, "float32")
    num_tokens = ops.maximum(ops.sum(mask), 1.0)
    routed = ops.cast(ops.sum(routing.kept, axis=-1) > 0, "float32") * mask
    dropped = 1.0 - ops.sum(routed) / num_tokens
    per_expert = ops.sum(
        ops.one_hot(routing.expert_index, routing.num_experts, dtype="float32")
        * routing.kept[..., None],
        axis=(0, 1, 2),
    )
    load = per_expert / ops.maximum(ops.sum(per_expert), 1.0)
    probs = routing.router_probs
    confidence = ops.sum(ops.max(probs, axis=-1) * mask) / num_tokens
    entropy_per_token = -ops.sum(probs * ops.log(ops.maximum(probs, 1e-9)), axis=-1)
    entropy = ops.sum(entropy_per_token * mask) / num_tokens
    return {
        "dropped_fraction": dropped,
        "expert_load": load,
        "load_imbalance": ops.max(load) * routing.num_experts,
        "router_confidence": confidence,
        "router_entropy": entropy,
        "aux_loss": ops.cast(routing.aux_loss, "float32"),
        "z_loss": ops.cast(routing.z_loss, "float32"),
    }


def router_metric_specs(num_experts):
    """Symbolic shapes of `router_metrics`' outputs (for functional models)."""
    specs = {name: keras.KerasTensor((), dtype="float32") for name in SCALAR_METRICS}
    specs["expert_load"] = keras.KerasTensor((num_experts,), dtype="float32")
    return specs


def make_metric_trackers(layer_name):
    """Keras `Mean` trackers of the scalar router statistics of one MoE layer.

    Assigned to a layer attribute, they show up in `model.metrics`, the `fit`
    history, the progress bar and TensorBoard as `<layer name>/<statistic>`.
    """
    return {name: keras.metrics.Mean(name=f"{layer_name}/{name}") for name in SCALAR_METRICS}


def update_metric_trackers(trackers, stats):
    for name, tracker in trackers.items():
        tracker.update_state(stats[name])
