"""The layers users plug into their own models, under one import path.

Example:
>>> from keras_moe import layers
>>> ffn = layers.SwitchFeedForward(num_experts=8, d_ff=2048)
"""

from keras_moe.layers.dense_feedforward import DenseFeedForward
from keras_moe.layers.experts import FeedForwardExperts
from keras_moe.layers.feedforward import GShardFeedForward, SwitchFeedForward, TopKFeedForward
from keras_moe.layers.moe import MoeLayer
from keras_moe.layers.shared_experts import SharedExpertFeedForward

__all__ = [
    "DenseFeedForward",
    "FeedForwardExperts",
    "GShardFeedForward",
    "MoeLayer",
    "SharedExpertFeedForward",
    "SwitchFeedForward",
    "TopKFeedForward",
]
