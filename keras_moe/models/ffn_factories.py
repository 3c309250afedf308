"""From a `T5Config` (the recipe) to what the blocks take: their arguments and FFNs.

The blocks (`EncoderBlock`, `DecoderBlock`) know nothing of `T5Config`: they
take explicit arguments and their FFN layer. `block_args` gives the arguments
and `FfnFactories` the FFN of each layer: the dense one, or the stack's sparse
FFN (`T5Config.sparse_ffn` / `encoder_sparse_ffn` / `decoder_sparse_ffn`) at the
sparse layer indices, causal in the decoder.

Example:
>>> import functools
>>> from keras_moe import SwitchFeedForward
>>> config = T5Config(d_model=16, num_heads=2, d_kv=8, d_ff=32, num_encoder_layers=2,
...     encoder_sparse_step=2,
...     sparse_ffn=functools.partial(SwitchFeedForward, num_experts=4, d_ff=8))
>>> factories = FfnFactories.from_config(config)
>>> [type(factories.make("encoder", i)).__name__ for i in range(2)]
['DenseFeedForward', 'SwitchFeedForward']
>>> sorted(block_args(config))
['d_kv', 'd_model', 'dropout_rate', 'init_scale', 'layer_norm_epsilon', 'num_heads']
"""

import dataclasses
from typing import Any, Callable, Dict, Optional, Tuple, cast

import keras

from keras_moe.arguments import Activation
from keras_moe.layers.dense_feedforward import DenseFeedForward
from keras_moe.models.config import SIDES, T5Config

# (name, metrics_prefix) -> a new FFN layer.
FfnFactory = Callable[..., keras.layers.Layer]


def block_args(config: T5Config) -> Dict[str, Any]:
    """The constructor arguments `config` gives every block, without the FFN.

    Args:
        config: the model's `T5Config`.
    """
    return dict(
        d_model=config.d_model,
        num_heads=config.num_heads,
        d_kv=config.head_dim,
        dropout_rate=config.dropout_rate,
        layer_norm_epsilon=config.layer_norm_epsilon,
        init_scale=config.init_scale,
    )


def dense_ffn_factory(config: T5Config) -> FfnFactory:
    """The factory of `config`'s dense FFN (`DenseFeedForward`)."""

    def make(name: str = "ffn", metrics_prefix: Optional[str] = None) -> keras.layers.Layer:
        del metrics_prefix  # a dense FFN logs no router metrics
        return DenseFeedForward(
            config.d_ff,
            cast(Activation, config.activation),  # one of ACTIVATIONS: T5Config checks it
            config.dropout_rate,
            init_scale=config.init_scale,
            name=name,
        )

    return make


def sparse_ffn_factory(config: T5Config, side: str) -> Optional[FfnFactory]:
    """The factory of `side`'s ("encoder" / "decoder") sparse FFN, None without one."""
    view = config.sparse_ffn_view(side)
    if view is None:
        return None

    def make(name: str = "ffn", metrics_prefix: Optional[str] = None) -> keras.layers.Layer:
        return view.make_layer(
            name,
            causal=side == "decoder",
            track_metrics=config.track_router_metrics,
            metrics_prefix=metrics_prefix,
        )

    return make


@dataclasses.dataclass(frozen=True)
class FfnFactories:
    """The FFN factories of a model and where its sparse layers are.

    Args:
        dense: makes the dense FFN.
        sparse: `{side: factory or None}`, the sparse FFN of each stack.
        sparse_layers: `{side: sparse layer indices}`.
    """

    dense: FfnFactory
    sparse: Dict[str, Optional[FfnFactory]]
    sparse_layers: Dict[str, Tuple[int, ...]]

    @classmethod
    def from_config(cls, config: T5Config) -> "FfnFactories":
        return cls(
            dense=dense_ffn_factory(config),
            sparse={side: sparse_ffn_factory(config, side) for side in SIDES},
            sparse_layers={
                "encoder": config.resolved_encoder_sparse_layers(),
                "decoder": config.resolved_decoder_sparse_layers(),
            },
        )

    def make(self, side: str, index: int, block_name: Optional[str] = None) -> keras.layers.Layer:
        """The FFN (named "ffn") of layer `index` of `side` ("encoder" / "decoder");
        a sparse one logs its metrics as `<block_name>/ffn/...`."""
        if side not in SIDES:
            raise ValueError(f"`side` must be one of {SIDES}, got {side!r}.")
        block_name = block_name or f"{side}_layer_{index}"
        sparse = self.sparse[side]
        if index in self.sparse_layers[side]:
            assert sparse is not None  # a stack with sparse layers has their factory
            return sparse(name="ffn", metrics_prefix=f"{block_name}/ffn")
        return self.dense(name="ffn")
