"""The encoder and decoder layers of the T5.1.1 / Switch / GShard model, and their FFN."""

import keras

from keras_moe.dense_feedforward import DenseFeedForward
from keras_moe.models.attention import T5Attention
from keras_moe.models.config import T5Config
from keras_moe.models.normalization import RMSNorm


def as_config(config):
    if isinstance(config, T5Config):
        return config
    if isinstance(config, dict):
        return T5Config.from_dict(config)
    raise ValueError(f"`config` must be a T5Config or a dict, got {type(config).__name__}.")


def make_ffn(config, sparse, side, name, metrics_prefix=None):
    """The FFN of one layer of `side` ("encoder" / "decoder"): dense, or the
    config's sparse FFN (`T5Config.sparse_ffn`)."""
    if not sparse:
        return DenseFeedForward(config.d_ff, config.activation, config.dropout_rate,
                                init_scale=config.init_scale, name=name)
    return config.make_sparse_ffn(side, name=name, metrics_prefix=metrics_prefix)


class _Block(keras.layers.Layer):
    """What the encoder and decoder layers share: pre-norm attention sublayers, the FFN
    branch, and building every sublayer for d_model inputs."""

    def __init__(self, config, layer_index, **kwargs):
        super().__init__(**kwargs)
        self.config = as_config(config)
        self.layer_index = layer_index

    def _norm_and_attention(self, name):
        c = self.config
        return (RMSNorm(c.layer_norm_epsilon, name=f"{name}_norm"),
                T5Attention(c.num_heads, c.head_dim, c.dropout_rate, init_scale=c.init_scale,
                            name=name))

    def _add_ffn(self, side):
        c = self.config
        self.ffn_norm = RMSNorm(c.layer_norm_epsilon, name="ffn_norm")
        self.ffn = make_ffn(c, self.is_sparse, side, name="ffn",
                            metrics_prefix=f"{self.name}/ffn")
        self.dropout = keras.layers.Dropout(c.dropout_rate)

    def sublayers(self):
        """The layers with weights, in order."""
        raise NotImplementedError

    def build(self, input_shape):
        shape = (None, None, self.config.d_model)
        for layer in self.sublayers():
            layer.build(shape)
        self.built = True

    def get_config(self):
        base = super().get_config()
        base.update(config=self.config.to_dict(), layer_index=self.layer_index)
        return base

    def _ffn_branch(self, x, token_mask, training, independent_routing=False):
        h = self.ffn_norm(x)
        if self.is_sparse:
            h = self.ffn(h, mask=token_mask, training=training,
                         independent_routing=independent_routing)
        else:
            h = self.ffn(h, training=training)
        return x + self.dropout(h, training=training)


@keras.saving.register_keras_serializable(package="keras_moe")
class EncoderBlock(_Block):
    """Pre-norm T5 encoder layer: self-attention then (dense or MoE) FFN, each residual.

    Args:
        config: `T5Config` (or its dict).
        layer_index: index of the layer in the encoder (decides dense vs sparse).

    Example:
    >>> import numpy as np
    >>> block = EncoderBlock(T5Config(d_model=16, num_heads=2, d_kv=8, d_ff=32), 0)
    >>> y = block(np.ones((2, 5, 16), "float32"), bias=np.zeros((1, 2, 5, 5), "float32"))
    >>> block.is_sparse, type(block.ffn).__name__, tuple(y.shape)  # a dense config
    (False, 'DenseFeedForward', (2, 5, 16))
    """

    def __init__(self, config, layer_index, **kwargs):
        super().__init__(config, layer_index, **kwargs)
        self.is_sparse = layer_index in self.config.resolved_encoder_sparse_layers()
        self.attention_norm, self.attention = self._norm_and_attention("attention")
        self._add_ffn("encoder")

    def sublayers(self):
        return (self.attention_norm, self.attention, self.ffn_norm, self.ffn)

    def call(self, x, bias, token_mask=None, training=None, independent_routing=False):
        """`independent_routing`: the MoE FFN routes each sequence apart (`MoeLayer`)."""
        h = self.attention(self.attention_norm(x), bias=bias, training=training)
        x = x + self.dropout(h, training=training)
        return self._ffn_branch(x, token_mask, training, independent_routing)


@keras.saving.register_keras_serializable(package="keras_moe")
class DecoderBlock(_Block):
    """Pre-norm T5 decoder layer: causal self-attention, cross-attention, FFN.

    MoE FFNs are built with `causal=True`.

    Args:
        config: `T5Config` (or its dict).
        layer_index: index of the layer in the decoder.

    Example:
    >>> import numpy as np
    >>> block = DecoderBlock(T5Config(d_model=16, num_heads=2, d_kv=8, d_ff=32), 0)
    >>> y = block(np.ones((2, 3, 16), "float32"), self_bias=np.zeros((1, 2, 3, 3), "float32"),
    ...           encoder_outputs=np.ones((2, 5, 16), "float32"),
    ...           cross_bias=np.zeros((1, 2, 3, 5), "float32"))
    >>> tuple(y.shape)  # [B, L_dec, d_model]
    (2, 3, 16)
    """

    def __init__(self, config, layer_index, **kwargs):
        super().__init__(config, layer_index, **kwargs)
        self.is_sparse = layer_index in self.config.resolved_decoder_sparse_layers()
        self.self_attention_norm, self.self_attention = self._norm_and_attention(
            "self_attention")
        self.cross_attention_norm, self.cross_attention = self._norm_and_attention(
            "cross_attention")
        self._add_ffn("decoder")

    def sublayers(self):
        return (self.self_attention_norm, self.self_attention, self.cross_attention_norm,
                self.cross_attention, self.ffn_norm, self.ffn)

    def call(self, x, self_bias, encoder_outputs, cross_bias, token_mask=None, cache=None,
             cache_index=None, training=None, independent_routing=False):
        """`cache`: None or dict(self=(k, v), cross=(k, v)); returns (x, new_cache) with a cache.
        `independent_routing`: the MoE FFN routes each sequence apart (`MoeLayer`)."""
        h = self.self_attention_norm(x)
        if cache is None:
            h = self.self_attention(h, bias=self_bias, training=training)
        else:
            h, self_kv = self.self_attention(h, bias=self_bias, cache=cache["self"],
                                             cache_index=cache_index, training=training)
        x = x + self.dropout(h, training=training)
        h = self.cross_attention_norm(x)
        if cache is None:
            h = self.cross_attention(h, kv=encoder_outputs, bias=cross_bias, training=training)
        else:
            h, _ = self.cross_attention(h, bias=cross_bias, cache=cache["cross"],
                                        training=training)
        x = x + self.dropout(h, training=training)
        x = self._ffn_branch(x, token_mask, training, independent_routing)
        if cache is None:
            return x
        return x, {"self": self_kv, "cross": cache["cross"]}
