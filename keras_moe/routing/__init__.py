"""Routers: decide which tokens go to which experts, and with what weight.

A router is a small Keras layer that holds the router kernel and turns
tokens `[G, S, d]` into float32 logits `[G, S, E]` (`router(x)`), plus a
routing algorithm (`router.route(...)`) that turns those logits into
`RoutingInstructions`. Routers never touch expert weights and never move
activations: that is the dispatcher's job (`dispatch.py`).

Conventions (all tensors are token-major, `K` routing choices per token):
- `expert_index[g, s, k]`: the expert of token `s`'s k-th choice.
- `position[g, s, k]`: its slot in that expert's buffer (valid where kept).
- `kept[g, s, k]`: 1.0 if the assignment fits within capacity and the token
  is real (not padding), else 0.0.
- `combine_weight[g, s, k]`: the weight of that expert's output in the
  token's output; exactly 0 where not kept.

Scores are the softmax or the sigmoid of the logits (`score_function`);
`selection.py` holds DeepSeek-V3's group-limited top-k and the loss-free
balancing bias update that `TopKRouter` composes.
"""

from keras_moe.arguments import NORMALIZE_GATES, SCORE_FUNCTIONS, SECOND_EXPERT_POLICIES
from keras_moe.routing.base import (
    Router,
    RoutingInstructions,
    default_router_initializer,
)
from keras_moe.routing.expert_choice import ExpertChoiceRouter
from keras_moe.routing.token_choice import (
    SwitchRouter,
    TokenChoiceRouter,
    Top2Router,
    TopKRouter,
)

__all__ = [
    "ExpertChoiceRouter",
    "NORMALIZE_GATES",
    "Router",
    "RoutingInstructions",
    "SCORE_FUNCTIONS",
    "SECOND_EXPERT_POLICIES",
    "SwitchRouter",
    "TokenChoiceRouter",
    "Top2Router",
    "TopKRouter",
    "default_router_initializer",
]
