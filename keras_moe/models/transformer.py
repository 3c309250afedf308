"""T5.1.1 / Switch / GShard encoder-decoder as a Keras model."""

from typing import Any, Dict, Union

import keras
from keras import ops

from keras_moe.models import seq2seq_objective
from keras_moe.models.attention import NEG_INF
from keras_moe.models.blocks import DecoderBlock, EncoderBlock
from keras_moe.models.config import T5Config
from keras_moe.models.distribute_compat import DistributedBuildMixin
from keras_moe.models.ffn_factories import FfnFactories, block_args
from keras_moe.models.inference_api import InferenceApiMixin
from keras_moe.models.normalization import RMSNorm
from keras_moe.models.position_bias import RelativePositionBias
from keras_moe.models.progress import CompactFitMixin
from keras_moe.models.routing_mode import RoutingScopeMixin
from keras_moe.routing.metrics import RouterMetricsMixin, claim_router_metrics


def as_config(config: Union[T5Config, Dict[str, Any]]) -> T5Config:
    """`config` as a `T5Config` (a dict is read with `T5Config.from_dict`)."""
    if isinstance(config, T5Config):
        return config
    if isinstance(config, dict):
        return T5Config.from_dict(config)
    raise ValueError(f"`config` must be a T5Config or a dict, got {type(config).__name__}.")


def check_token_ids(tokens, vocab_size: int, name: str):
    """`tokens` (int32), raising a clear error naming `vocab_size` for ids outside [0, vocab_size).

    Without it an out-of-range id gives a cryptic `GatherV2` error on CPU and
    silently a zero embedding on GPU. Eager/concrete inputs raise `ValueError`
    here; in a TF graph (`fit`) a `tf.debugging` assert raises
    `InvalidArgumentError` with the same message (XLA drops asserts).
    """
    message = (
        f"`{name}` holds token ids outside [0, vocab_size) with vocab_size="
        f"{vocab_size}: the data's vocabulary does not match the model's "
        "`T5Config.vocab_size`."
    )
    if keras.backend.backend() == "tensorflow":
        import tensorflow as tf

        if not tf.executing_eagerly():
            checks = [
                tf.debugging.assert_less(
                    tokens, tf.constant(vocab_size, tokens.dtype), message=message
                ),
                tf.debugging.assert_non_negative(tokens, message=message),
            ]
            with tf.control_dependencies(checks):
                return tf.identity(tokens)
    try:
        values = ops.convert_to_numpy(tokens)
    except Exception:  # a tracer: nothing to check at trace time
        return tokens
    if values.size and (values.max() >= vocab_size or values.min() < 0):
        raise ValueError(f"{message} Got ids in [{values.min()}, {values.max()}].")
    return tokens


def _mask_to_bias(mask):
    return ops.where(mask, 0.0, NEG_INF)


def _positions(tokens, positions):
    if positions is not None:
        return ops.cast(positions, "int32")
    return ops.arange(ops.shape(tokens)[1], dtype="int32")[None, :]


@keras.saving.register_keras_serializable(package="keras_moe")
class EncoderDecoder(
    CompactFitMixin,
    RoutingScopeMixin,
    RouterMetricsMixin,
    DistributedBuildMixin,
    InferenceApiMixin,
    keras.Model,
):
    """T5.1.1-style encoder-decoder with optional Switch / GShard MoE FFN layers.

    Pre-norm RMS layer norms, T5 relative position bias (bidirectional in the
    encoder, causal in the decoder, computed once per stack and shared by its
    layers), bias-free multi-head attention, dense or MoE FFNs, shared input
    embedding, tied (scaled by `d_model ** -0.5`) or untied output logits.

    Inputs follow seqio's `EncDecFeatureConverter`: a dict with
    `encoder_input_tokens` and `decoder_input_tokens` `[B, L]` (int, 0 = padding,
    the decoder starts with id 0), and, for packed examples,
    `encoder_segment_ids`, `encoder_positions`, `decoder_segment_ids`,
    `decoder_positions`. Packed segments never attend to each other and
    relative positions come from `*_positions`. Other keys are ignored, so a
    whole seqio feature dict may be passed. Padding is masked in attention and
    passed as `mask` to the MoE layers (it takes no expert capacity).

    Calling the model returns float32 logits `[B, L_dec, vocab_size]`; the MoE
    layers add their aux and z losses to `model.losses`. With
    `T5Config.track_router_metrics`, `fit` and `evaluate` log each MoE layer's
    router statistics (`RouterMetricsMixin`) on TensorFlow and JAX.

    Args:
        config: a `T5Config` (or its dict).

    Example:
    >>> import numpy as np
    >>> from keras_moe import SwitchFeedForward
    >>> model = EncoderDecoder(T5Config(vocab_size=64, d_model=32, num_heads=4,
    ...     d_kv=8, d_ff=64, num_encoder_layers=2, num_decoder_layers=2,
    ...     encoder_sparse_step=2, decoder_sparse_step=2,
    ...     sparse_ffn=SwitchFeedForward(num_experts=4, d_ff=64)))
    >>> model.compile(**model.compile_defaults())
    >>> logits = model({"encoder_input_tokens": np.ones((2, 7), "int32"),
    ...                 "decoder_input_tokens": np.zeros((2, 5), "int32")})
    >>> tuple(logits.shape)  # [B, L_dec, vocab_size]
    (2, 5, 64)
    >>> tokens = model.generate(np.ones((2, 7), "int32"), max_length=5)
    >>> tokens.dtype, tokens.shape[0], tokens.shape[1] <= 5
    (dtype('int32'), 2, True)
    """

    def __init__(self, config: Union[T5Config, Dict[str, Any]], **kwargs):
        super().__init__(**kwargs)
        self.config = c = as_config(config)
        self.token_embedding = keras.layers.Embedding(
            c.vocab_size,
            c.d_model,
            embeddings_initializer=keras.initializers.RandomNormal(stddev=c.init_scale**0.5),
            name="token_embedding",
        )
        self.encoder_position_bias = RelativePositionBias(
            c.num_heads,
            c.relative_attention_num_buckets,
            c.relative_attention_max_distance,
            bidirectional=True,
            name="encoder_position_bias",
        )
        self.decoder_position_bias = RelativePositionBias(
            c.num_heads,
            c.relative_attention_num_buckets,
            c.relative_attention_max_distance,
            bidirectional=False,
            name="decoder_position_bias",
        )
        ffns, args = FfnFactories.from_config(c), block_args(c)
        self.encoder_layers = [
            EncoderBlock(**args, ffn=ffns.make("encoder", i), name=f"encoder_layer_{i}")
            for i in range(c.num_encoder_layers)
        ]
        self.decoder_layers = [
            DecoderBlock(**args, ffn=ffns.make("decoder", i), name=f"decoder_layer_{i}")
            for i in range(c.num_decoder_layers)
        ]
        self.encoder_norm = RMSNorm(c.layer_norm_epsilon, name="encoder_norm")
        self.decoder_norm = RMSNorm(c.layer_norm_epsilon, name="decoder_norm")
        self.dropout = keras.layers.Dropout(c.dropout_rate)
        self.lm_head = None
        if not c.tie_word_embeddings:
            self.lm_head = keras.layers.Dense(
                c.vocab_size,
                use_bias=False,
                name="lm_head",
                kernel_initializer=keras.initializers.RandomNormal(
                    stddev=(c.init_scale / c.d_model) ** 0.5
                ),
            )
        self._build_all()
        claim_router_metrics(self)

    def _build_all(self):
        shape = (None, None, self.config.d_model)
        self.token_embedding.build((None, None))
        self.encoder_position_bias.build()
        self.decoder_position_bias.build()
        for layer in self.encoder_layers + self.decoder_layers:
            layer.build(shape)
        self.encoder_norm.build(shape)
        self.decoder_norm.build(shape)
        if self.lm_head is not None:
            self.lm_head.build(shape)
        self.built = True

    def build(self, input_shape=None):
        self.built = True

    # ------------------------------------------------------------------ masks
    def encoder_masks(self, tokens, segment_ids=None):
        """Token mask `[B, L]` (bool) and attention mask `[B, 1, L, L]`."""
        if segment_ids is not None:
            token_mask = ops.not_equal(segment_ids, 0)
        else:
            token_mask = ops.not_equal(tokens, self.config.pad_id)
        attn = token_mask[:, None, None, :]
        if segment_ids is not None:
            attn = ops.logical_and(
                attn, ops.equal(segment_ids[:, :, None], segment_ids[:, None, :])[:, None]
            )
        return token_mask, attn

    def decoder_token_mask(self, tokens, segment_ids=None):
        if segment_ids is not None:
            return ops.not_equal(segment_ids, 0)
        first = ops.equal(ops.arange(ops.shape(tokens)[1])[None, :], 0)
        return ops.logical_or(ops.not_equal(tokens, self.config.pad_id), first)

    # ------------------------------------------------------------------ stacks
    def encode(
        self,
        encoder_input_tokens,
        encoder_segment_ids=None,
        encoder_positions=None,
        training=None,
        independent_routing=None,
    ):
        """Encoder outputs `[B, L, d]` and the encoder token mask `[B, L]`.

        `independent_routing`: the MoE layers route each sequence apart from
        the rest of the batch (decoding and serving pass True; `MoeLayer`).
        None: inside `keras_moe.route_each_sequence()`, as True; else each MoE
        layer's own `group_size`.
        """
        tokens = check_token_ids(
            ops.cast(encoder_input_tokens, "int32"), self.config.vocab_size, "encoder_input_tokens"
        )
        token_mask, attn_mask = self.encoder_masks(tokens, encoder_segment_ids)
        positions = _positions(tokens, encoder_positions)
        bias = self.encoder_position_bias(positions, positions) + _mask_to_bias(attn_mask)
        x = self.dropout(self.token_embedding(tokens), training=training)
        for layer in self.encoder_layers:
            x = layer(
                x,
                bias,
                token_mask=token_mask,
                training=training,
                independent_routing=independent_routing,
            )
        x = self.dropout(self.encoder_norm(x), training=training)
        return x, token_mask

    def logits(self, x):
        """Decoder outputs `[..., d]` -> float32 logits `[..., vocab]`."""
        if self.config.scales_decoder_outputs:
            x = x * (self.config.d_model**-0.5)
        if self.lm_head is None:
            # Explicit labels, not "...d,vd->...v": TensorFlow's einsum with an ellipsis
            # took 70x as long forward and backward ([16, 64, 64] x [8100, 64]).
            equation = "bd,vd->bv" if len(x.shape) == 2 else "bld,vd->blv"
            out = ops.einsum(equation, x, ops.cast(self.token_embedding.embeddings, x.dtype))
        else:
            out = self.lm_head(x)
        return ops.cast(out, "float32")

    def decode(
        self,
        decoder_input_tokens,
        encoder_outputs,
        encoder_mask,
        decoder_segment_ids=None,
        decoder_positions=None,
        encoder_segment_ids=None,
        training=None,
        independent_routing=None,
    ):
        """Teacher-forced decoder: logits `[B, L_dec, vocab]` (`independent_routing`: as
        in `encode`)."""
        tokens = check_token_ids(
            ops.cast(decoder_input_tokens, "int32"), self.config.vocab_size, "decoder_input_tokens"
        )
        length = ops.shape(tokens)[1]
        token_mask = self.decoder_token_mask(tokens, decoder_segment_ids)
        idx = ops.arange(length)
        self_mask = ops.greater_equal(idx[:, None], idx[None, :])[None, None]
        if decoder_segment_ids is not None:
            same = ops.equal(decoder_segment_ids[:, :, None], decoder_segment_ids[:, None, :])
            self_mask = ops.logical_and(self_mask, same[:, None])
        positions = _positions(tokens, decoder_positions)
        self_bias = self.decoder_position_bias(positions, positions) + _mask_to_bias(self_mask)
        cross_mask = encoder_mask[:, None, None, :]
        if decoder_segment_ids is not None and encoder_segment_ids is not None:
            same = ops.equal(decoder_segment_ids[:, :, None], encoder_segment_ids[:, None, :])
            cross_mask = ops.logical_and(cross_mask, same[:, None])
        cross_bias = _mask_to_bias(cross_mask)
        x = self.dropout(self.token_embedding(tokens), training=training)
        for layer in self.decoder_layers:
            x = layer(
                x,
                self_bias,
                encoder_outputs,
                cross_bias,
                token_mask=token_mask,
                training=training,
                independent_routing=independent_routing,
            )
        x = self.dropout(self.decoder_norm(x), training=training)
        return self.logits(x)

    def call(self, inputs, training=None):
        if not isinstance(inputs, dict):
            raise ValueError(
                "EncoderDecoder expects a dict with `encoder_input_tokens` and "
                f"`decoder_input_tokens`, got {type(inputs).__name__}."
            )
        enc_seg = inputs.get("encoder_segment_ids")
        dec_seg = inputs.get("decoder_segment_ids")
        enc_out, enc_mask = self.encode(
            inputs["encoder_input_tokens"],
            enc_seg,
            inputs.get("encoder_positions"),
            training=training,
        )
        return self.decode(
            inputs["decoder_input_tokens"],
            enc_out,
            enc_mask,
            dec_seg,
            inputs.get("decoder_positions"),
            enc_seg,
            training=training,
        )

    # ------------------------------------------------------------ incremental
    def init_cache(self, encoder_outputs, max_length):
        """Per-layer caches: empty self-attention k/v `[B, H, T, d_kv]` and cross k/v
        `[B, H, L, d_kv]`."""
        batch = ops.shape(encoder_outputs)[0]
        c = self.config
        caches = []
        for layer in self.decoder_layers:
            zeros = ops.zeros((batch, c.num_heads, max_length, c.head_dim), encoder_outputs.dtype)
            caches.append(
                {
                    "self": (zeros, zeros),
                    "cross": layer.cross_attention.compute_kv_cache(encoder_outputs),
                }
            )
        return caches

    def decode_step(self, tokens, index, caches, encoder_mask):
        """One cached decoding step: `tokens [B]` at position `index` -> logits `[B, V]`, caches."""
        max_length = ops.shape(caches[0]["self"][0])[2]
        x = self.token_embedding(ops.cast(tokens, "int32")[:, None])
        keys = ops.arange(max_length, dtype="int32")[None, :]
        query = ops.full((1, 1), index, dtype="int32")
        self_bias = self.decoder_position_bias(query, keys) + _mask_to_bias(
            ops.less_equal(keys, index)[:, None, None, :]
        )
        cross_bias = _mask_to_bias(encoder_mask[:, None, None, :])
        new_caches = []
        for layer, cache in zip(self.decoder_layers, caches, strict=False):
            x, cache = layer(
                x,
                self_bias,
                None,
                cross_bias,
                token_mask=None,
                cache=cache,
                cache_index=index,
                training=False,
            )
            new_caches.append(cache)
        return self.logits(self.decoder_norm(x))[:, 0], new_caches

    # ------------------------------------------------------------------ API
    def compile_defaults(self, learning_rate=1e-3, optimizer=None, jit_compile=False):
        """Keyword arguments for `compile`: T5 loss, weighted accuracy, neg log perplexity."""

        return seq2seq_objective.compile_defaults(
            learning_rate=learning_rate, optimizer=optimizer, jit_compile=jit_compile
        )

    def _targets_from_x(self, x, y, sample_weight):
        if y is None and isinstance(x, dict) and "decoder_target_tokens" in x:
            y = x["decoder_target_tokens"]
            if sample_weight is None:
                sample_weight = x.get("decoder_loss_weights")
        if y is not None and sample_weight is None:
            sample_weight = ops.cast(ops.not_equal(y, self.config.pad_id), "float32")
        return y, sample_weight

    def compute_loss(self, x=None, y=None, y_pred=None, sample_weight=None, training=True):
        y, sample_weight = self._targets_from_x(x, y, sample_weight)
        if sample_weight is not None:
            sample_weight = ops.cast(sample_weight, "float32")
        return super().compute_loss(
            x=x, y=y, y_pred=y_pred, sample_weight=sample_weight, training=training
        )

    def compute_metrics(self, x, y, y_pred, sample_weight=None):
        y, sample_weight = self._targets_from_x(x, y, sample_weight)
        if sample_weight is not None:
            sample_weight = ops.cast(sample_weight, "float32")
        return super().compute_metrics(x, y, y_pred, sample_weight=sample_weight)

    def get_config(self):
        return {"config": self.config.to_dict(), "name": self.name}

    @classmethod
    def from_config(cls, config):
        return cls(**config)
