"""keras_moe: sparse Mixture-of-Experts layers and models for Keras 3.

The layers follow the Switch Transformer (Fedus et al., 2021) and GShard
(Lepikhin et al., 2020) papers; see the README for the quick-starts.
"""

from keras_moe import startup as _startup

# Before keras (and so jax) starts: no TPU runtime probe on a host without one.
_startup.jax_on_cpu_without_accelerator()
# A keras_moe command filters TensorFlow's start-up chatter from its console;
# anywhere else, importing keras_moe leaves the process's stderr alone.
if _startup.launched_as_command():
    _startup.import_keras_quietly()

from keras_moe.dispatch import (
    Dispatcher,
    EinsumDispatcher,
    GatherDispatcher,
    get_dispatcher,
)
from keras_moe.layers.experts import FeedForwardExperts
from keras_moe.layers.feedforward import (
    GShardFeedForward,
    SwitchFeedForward,
    TopKFeedForward,
)
from keras_moe.layers.moe import MoeLayer
from keras_moe.layers.shared_experts import SharedExpertFeedForward
from keras_moe.parallel import sharding
from keras_moe.routing import (
    ExpertChoiceRouter,
    Router,
    RoutingInstructions,
    SwitchRouter,
    TokenChoiceRouter,
    Top2Router,
    TopKRouter,
)
from keras_moe.routing import losses as router_losses
from keras_moe.routing.metrics import RouterMetricsMixin, router_metrics
from keras_moe.routing.scope import route_each_sequence

__version__ = "0.1.0"

_KERAS_HUB_NAMES = ("sparsify", "from_preset")


def __getattr__(name: str):
    # keras-hub is optional and slow to import: only when these are used.
    if name in _KERAS_HUB_NAMES:
        from keras_moe import keras_hub as keras_hub_wing

        return getattr(keras_hub_wing, name)
    # The gin door imports the model library: only when it is used.
    if name == "parse_gin":
        from keras_moe.gin_config import parse_gin  # noqa: PLC0415 - loads the models

        return parse_gin
    raise AttributeError(f"module 'keras_moe' has no attribute {name!r}")


__all__ = [
    "Dispatcher",
    "EinsumDispatcher",
    "ExpertChoiceRouter",
    "FeedForwardExperts",
    "GShardFeedForward",
    "GatherDispatcher",
    "MoeLayer",
    "Router",
    "RouterMetricsMixin",
    "RoutingInstructions",
    "SharedExpertFeedForward",
    "SwitchFeedForward",
    "SwitchRouter",
    "TokenChoiceRouter",
    "Top2Router",
    "TopKFeedForward",
    "TopKRouter",
    "get_dispatcher",
    "parse_gin",
    "route_each_sequence",
    "router_losses",
    "router_metrics",
    "sharding",
    "sparsify",
    "from_preset",
]
