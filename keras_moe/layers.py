"""The layers users plug into their own models, under one import path.

Example:
>>> from keras_moe import layers
>>> ffn = layers.SwitchFeedForward(num_experts=8, d_ff=2048)
"""

from keras_moe.experts import FeedForwardExperts
from keras_moe.feedforward import DenseFeedForward, GShardFeedForward, SwitchFeedForward
from keras_moe.moe import MoeLayer

__all__ = [
    "DenseFeedForward", "FeedForwardExperts", "GShardFeedForward", "MoeLayer", "SwitchFeedForward",
]
