"""The encoder and decoder layers of the T5.1.1 / Switch / GShard model.

A block takes explicit arguments and its FFN layer (dense or MoE), as in
Flaxformer and keras-hub; the model makes both from its `T5Config`
(`keras_moe.models.ffn_factories`). `get_config` saves exactly those
arguments, the FFN serialized with `keras.saving.serialize_keras_object`, so
a block reloads with its own FFN. Configs saved by earlier versions (the whole
`T5Config` and a layer index) still load (`from_config`).
"""

from typing import Any, Dict, Union

import keras

from keras_moe.layers.dense_feedforward import DenseFeedForward  # noqa: F401 (the examples use it)
from keras_moe.layers.moe import MoeLayer
from keras_moe.models.attention import T5Attention
from keras_moe.models.config import T5Config
from keras_moe.models.ffn_factories import FfnFactories, block_args
from keras_moe.models.normalization import RMSNorm

FfnArg = Union[keras.layers.Layer, Dict[str, Any]]


def _serialize_ffn(ffn):
    # Without its build config: the block builds its FFN in its own name scope,
    # which gives the weights their paths (`<block>/ffn/...`).
    config = keras.saving.serialize_keras_object(ffn)
    config.pop("build_config", None)
    return config


def _as_ffn(ffn):
    if isinstance(ffn, dict):
        ffn = {k: v for k, v in ffn.items() if k != "build_config"}
        ffn = keras.saving.deserialize_keras_object(ffn)
    if not isinstance(ffn, keras.layers.Layer):
        raise ValueError(
            "`ffn` must be a Keras layer (e.g. `DenseFeedForward` or a MoE "
            f"layer) or its serialized config, got {type(ffn).__name__}."
        )
    return ffn


def _legacy_block_args(config, side):
    """Block arguments and FFN of a config saved as `{"config": <T5Config dict>,
    "layer_index": i, ...}` (the form before the blocks took explicit arguments)."""

    config = dict(config)
    t5 = T5Config.from_dict(config.pop("config"))
    index = config.pop("layer_index")
    name = config.get("name") or f"{side}_layer_{index}"
    config.update(block_args(t5), ffn=FfnFactories.from_config(t5).make(side, index, name))
    return config


class _Block(keras.layers.Layer):
    """What the encoder and decoder layers share: pre-norm attention sublayers, the FFN
    branch, the config, and building every sublayer for d_model inputs."""

    _side: str | None = None  # "encoder" / "decoder" in the two blocks

    def __init__(
        self,
        d_model: int,
        num_heads: int,
        d_kv: int,
        dropout_rate: float = 0.0,
        layer_norm_epsilon: float = 1e-6,
        init_scale: float = 1.0,
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.d_model = d_model
        self.num_heads = num_heads
        self.d_kv = d_kv
        self.dropout_rate = dropout_rate
        self.layer_norm_epsilon = layer_norm_epsilon
        self.init_scale = init_scale

    def _norm_and_attention(self, name):
        return (
            RMSNorm(self.layer_norm_epsilon, name=f"{name}_norm"),
            T5Attention(
                self.num_heads, self.d_kv, self.dropout_rate, init_scale=self.init_scale, name=name
            ),
        )

    def _add_ffn(self, ffn):
        # Set after the attention sublayers: the weights keep their order.
        self.ffn_norm = RMSNorm(self.layer_norm_epsilon, name="ffn_norm")
        self.ffn = _as_ffn(ffn)
        self.dropout = keras.layers.Dropout(self.dropout_rate)

    @property
    def is_sparse(self) -> bool:
        """Whether the FFN is a MoE layer."""
        return isinstance(self.ffn, MoeLayer)

    def sublayers(self):
        """The layers with weights, in order."""
        raise NotImplementedError

    def build(self, input_shape):
        shape = (None, None, self.d_model)
        for layer in self.sublayers():
            layer.build(shape)
        self.built = True

    def get_config(self) -> Dict[str, Any]:
        base = super().get_config()
        base.update(
            d_model=self.d_model,
            num_heads=self.num_heads,
            d_kv=self.d_kv,
            dropout_rate=self.dropout_rate,
            layer_norm_epsilon=self.layer_norm_epsilon,
            init_scale=self.init_scale,
            ffn=_serialize_ffn(self.ffn),
        )
        return base

    @classmethod
    def from_config(cls, config: Dict[str, Any]) -> "_Block":
        """The block of `get_config()`, also of a config of the earlier whole-config form."""
        if "layer_index" in config and "config" in config:
            config = _legacy_block_args(config, cls._side)
        return cls(**config)

    def _ffn_branch(self, x, token_mask, training, independent_routing=None):
        h = self.ffn_norm(x)
        if self.is_sparse:
            h = self.ffn(
                h, mask=token_mask, training=training, independent_routing=independent_routing
            )
        else:
            h = self.ffn(h, training=training)
        return x + self.dropout(h, training=training)


@keras.saving.register_keras_serializable(package="keras_moe")
class EncoderBlock(_Block):
    """Pre-norm T5 encoder layer: self-attention then its FFN, each a residual branch.

    Args:
        d_model: width of the inputs and outputs.
        num_heads: attention heads.
        d_kv: size of one attention head.
        ffn: the FFN layer (`DenseFeedForward` or a MoE layer such as
            `SwitchFeedForward`) or its serialized config. The model names it
            "ffn" (the weights' paths, `<block>/ffn/...`, follow the name).
        dropout_rate: dropout on attention weights and on each residual branch.
        layer_norm_epsilon: RMS norm epsilon.
        init_scale: variance scale of the attention weights' init.
        **kwargs: `keras.layers.Layer` arguments (name, dtype).

    Example:
    >>> import numpy as np
    >>> block = EncoderBlock(16, 2, 8, ffn=DenseFeedForward(32, name="ffn"))
    >>> y = block(np.ones((2, 5, 16), "float32"), bias=np.zeros((1, 2, 5, 5), "float32"))
    >>> block.is_sparse, tuple(y.shape)
    (False, (2, 5, 16))
    >>> type(EncoderBlock.from_config(block.get_config()).ffn).__name__  # its own FFN
    'DenseFeedForward'
    """

    _side = "encoder"

    def __init__(
        self,
        d_model: int,
        num_heads: int,
        d_kv: int,
        ffn: FfnArg,
        dropout_rate: float = 0.0,
        layer_norm_epsilon: float = 1e-6,
        init_scale: float = 1.0,
        **kwargs,
    ):
        super().__init__(
            d_model,
            num_heads,
            d_kv,
            dropout_rate=dropout_rate,
            layer_norm_epsilon=layer_norm_epsilon,
            init_scale=init_scale,
            **kwargs,
        )
        self.attention_norm, self.attention = self._norm_and_attention("attention")
        self._add_ffn(ffn)

    def sublayers(self):
        return (self.attention_norm, self.attention, self.ffn_norm, self.ffn)

    def call(self, x, bias, token_mask=None, training=None, independent_routing=None):
        """`independent_routing`: the MoE FFN routes each sequence apart (`MoeLayer`; None:
        as the thread's `keras_moe.route_each_sequence()` scope says)."""
        h = self.attention(self.attention_norm(x), bias=bias, training=training)
        x = x + self.dropout(h, training=training)
        return self._ffn_branch(x, token_mask, training, independent_routing)


@keras.saving.register_keras_serializable(package="keras_moe")
class DecoderBlock(_Block):
    """Pre-norm T5 decoder layer: causal self-attention, cross-attention, FFN.

    A MoE `ffn` must be causal (`causal=True`): a token's routing may not depend
    on later tokens.

    Args:
        d_model: width of the inputs and outputs.
        num_heads: attention heads (self- and cross-attention).
        d_kv: size of one attention head.
        ffn: the FFN layer or its serialized config (see `EncoderBlock`).
        dropout_rate: dropout on attention weights and on each residual branch.
        layer_norm_epsilon: RMS norm epsilon.
        init_scale: variance scale of the attention weights' init.
        **kwargs: `keras.layers.Layer` arguments (name, dtype).

    Example:
    >>> import numpy as np
    >>> from keras_moe import SwitchFeedForward
    >>> block = DecoderBlock(16, 2, 8, ffn=SwitchFeedForward(4, 8, causal=True, name="ffn"))
    >>> y = block(np.ones((2, 3, 16), "float32"), self_bias=np.zeros((1, 2, 3, 3), "float32"),
    ...           encoder_outputs=np.ones((2, 5, 16), "float32"),
    ...           cross_bias=np.zeros((1, 2, 3, 5), "float32"))
    >>> block.is_sparse, tuple(y.shape)  # [B, L_dec, d_model]
    (True, (2, 3, 16))
    """

    _side = "decoder"

    def __init__(
        self,
        d_model: int,
        num_heads: int,
        d_kv: int,
        ffn: FfnArg,
        dropout_rate: float = 0.0,
        layer_norm_epsilon: float = 1e-6,
        init_scale: float = 1.0,
        **kwargs,
    ):
        super().__init__(
            d_model,
            num_heads,
            d_kv,
            dropout_rate=dropout_rate,
            layer_norm_epsilon=layer_norm_epsilon,
            init_scale=init_scale,
            **kwargs,
        )
        self.self_attention_norm, self.self_attention = self._norm_and_attention("self_attention")
        self.cross_attention_norm, self.cross_attention = self._norm_and_attention(
            "cross_attention"
        )
        self._add_ffn(ffn)
        if self.is_sparse and not self.ffn.causal:
            raise ValueError(
                "a DecoderBlock's MoE `ffn` must be causal (made with "
                "causal=True), got causal=False."
            )

    def sublayers(self):
        return (
            self.self_attention_norm,
            self.self_attention,
            self.cross_attention_norm,
            self.cross_attention,
            self.ffn_norm,
            self.ffn,
        )

    def call(
        self,
        x,
        self_bias,
        encoder_outputs,
        cross_bias,
        token_mask=None,
        cache=None,
        cache_index=None,
        training=None,
        independent_routing=None,
    ):
        """`cache`: None or dict(self=(k, v), cross=(k, v)); returns (x, new_cache) with a cache.
        `independent_routing`: the MoE FFN routes each sequence apart (`MoeLayer`; None:
        as the thread's `keras_moe.route_each_sequence()` scope says)."""
        h = self.self_attention_norm(x)
        if cache is None:
            h = self.self_attention(h, bias=self_bias, training=training)
        else:
            h, self_kv = self.self_attention(
                h, bias=self_bias, cache=cache["self"], cache_index=cache_index, training=training
            )
        x = x + self.dropout(h, training=training)
        h = self.cross_attention_norm(x)
        if cache is None:
            h = self.cross_attention(h, kv=encoder_outputs, bias=cross_bias, training=training)
        else:
            h, _ = self.cross_attention(h, bias=cross_bias, cache=cache["cross"], training=training)
        x = x + self.dropout(h, training=training)
        x = self._ffn_branch(x, token_mask, training, independent_routing)
        if cache is None:
            return x
        return x, {"self": self_kv, "cross": cache["cross"]}
