"""keras_moe: sparse Mixture-of-Experts layers and models for Keras 3.

The layers follow the Switch Transformer (Fedus et al., 2021) and GShard
(Lepikhin et al., 2020) papers; see the README for the quick-starts.
"""

from keras_moe.lazy_exports import lazy_exports as _lazy_exports

# Imported on first use: `import keras_moe` leaves Keras and its backend alone.
_EXPORTS = {
    "Dispatcher": "keras_moe.dispatch",
    "EinsumDispatcher": "keras_moe.dispatch",
    "GatherDispatcher": "keras_moe.dispatch",
    "get_dispatcher": "keras_moe.dispatch",
    "FeedForwardExperts": "keras_moe.experts",
    "GShardFeedForward": "keras_moe.feedforward",
    "SwitchFeedForward": "keras_moe.feedforward",
    "router_metrics": "keras_moe.metrics",
    "MoeLayer": "keras_moe.moe",
    "route_each_sequence": "keras_moe.moe",
    **{name: "keras_moe.routing" for name in (
        "ExpertChoiceRouter", "Router", "RoutingInstructions", "SwitchRouter",
        "TokenChoiceRouter", "Top2Router", "TopKRouter")},
    "router_losses": None,
    "sharding": None,
}
__getattr__, __dir__ = _lazy_exports(__name__, _EXPORTS)

__version__ = "0.1.0"

__all__ = [
    "Dispatcher", "EinsumDispatcher", "ExpertChoiceRouter", "FeedForwardExperts",
    "GShardFeedForward", "GatherDispatcher", "MoeLayer", "Router", "RoutingInstructions",
    "SwitchFeedForward", "SwitchRouter", "TokenChoiceRouter", "Top2Router", "TopKRouter",
    "get_dispatcher", "route_each_sequence", "router_losses", "router_metrics", "sharding",
]
