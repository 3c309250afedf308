"""gin registrations for the model library (module `keras_moe.models`) and the
MoE layers a model's sparse FFN is made of (module `keras_moe`).

Gin files write `build_model.config = @T5Config()`, `T5Config.d_model = 512`
and inject the sparse FFN Flaxformer-style, with the layer's own bindings and
per-stack scopes (see `gin/models/`):

    T5Config.sparse_ffn = @SwitchFeedForward
    SwitchFeedForward.num_experts = 8
    T5Config.encoder_sparse_ffn = @encoder/SwitchFeedForward
    encoder/SwitchFeedForward.batch_prioritized_routing = True

A general `@MoeLayer` takes any router: `MoeLayer.router = @TopKRouter()`,
`MoeLayer.experts = @FeedForwardExperts()`. Parsing is
`keras_moe.gin_config.parse_gin`.
"""

import gin
from keras_moe import routing
from keras_moe.layers import experts, feedforward, moe, shared_experts
from keras_moe.models import config as config_lib
from keras_moe.models import model_builder

T5Config = gin.external_configurable(
    config_lib.T5Config, name="T5Config", module="keras_moe.models"
)
build_model = gin.external_configurable(
    model_builder.build_model, name="build_model", module="keras_moe.models"
)

_LAYERS = (
    feedforward.SwitchFeedForward,
    feedforward.GShardFeedForward,
    feedforward.TopKFeedForward,
    moe.MoeLayer,
    experts.FeedForwardExperts,
    shared_experts.SharedExpertFeedForward,
    routing.SwitchRouter,
    routing.Top2Router,
    routing.TopKRouter,
    routing.ExpertChoiceRouter,
)
for _layer in _LAYERS:
    gin.external_configurable(_layer, module="keras_moe")

# The configurables a model's architecture is made of, by gin's full names: gin
# calls every one a model uses while it makes the `T5Config` (the sparse FFN's
# spec is made from its layer then), so once the config exists a binding of one
# that no call read configures nothing (`keras_moe.gin_config.unread`).
# `build_model` is left out: the job calls it later.
MODEL_SELECTORS = ("keras_moe.models.T5Config",) + tuple(
    f"keras_moe.{layer.__name__}" for layer in _LAYERS
)
