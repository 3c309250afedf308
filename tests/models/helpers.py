"""Small configs shared by the model tests."""

import dataclasses
import functools

from keras_moe import GShardFeedForward, SwitchFeedForward
from keras_moe.models import T5Config

MOE_LAYERS = {"switch": SwitchFeedForward, "gshard": GShardFeedForward}


def t5_config(moe_type=None, **kwargs):
    """A `T5Config` whose sparse FFN is a `moe_type` ("switch" / "gshard") layer made
    from the keywords that are not T5Config fields. The experts' `d_ff`,
    `activation` and `init_scale` follow the model's unless `expert_d_ff`,
    `expert_activation` or `expert_init_scale` are given."""
    fields = {field.name for field in dataclasses.fields(T5Config)}
    model = {k: v for k, v in kwargs.items() if k in fields}
    layer = {k: v for k, v in kwargs.items() if k not in fields}
    if moe_type is None:
        if layer:
            raise TypeError(f"MoE layer arguments {sorted(layer)} without a `moe_type`.")
        return T5Config(**model)
    defaults = T5Config()
    layer.setdefault("d_ff", layer.pop("expert_d_ff", None) or model.get("d_ff", defaults.d_ff))
    layer.setdefault(
        "activation",
        layer.pop("expert_activation", None) or model.get("activation", defaults.activation),
    )
    layer.setdefault(
        "init_scale",
        layer.pop("expert_init_scale", None) or model.get("init_scale", defaults.init_scale),
    )
    return T5Config(sparse_ffn=functools.partial(MOE_LAYERS[moe_type], **layer), **model)


def tiny_config(**overrides):
    args = dict(
        vocab_size=40,
        d_model=16,
        num_heads=2,
        d_kv=6,
        d_ff=24,
        num_encoder_layers=2,
        num_decoder_layers=2,
        dropout_rate=0.0,
    )
    args.update(overrides)
    return t5_config(**args)


def tiny_switch_config(**overrides):
    args = dict(
        moe_type="switch",
        num_experts=4,
        encoder_sparse_step=2,
        decoder_sparse_step=1,
        activation="relu",
        min_expert_capacity=4,
    )
    args.update(overrides)
    return tiny_config(**args)


def compiled_tiny_switch_and_batch(rows, seed=0):
    """A compiled tiny Switch `EncoderDecoder` with router metrics on (random weights of
    `seed`) and a batch of `rows` random sequences of 6 tokens, targets included."""
    import keras
    import numpy as np

    from keras_moe.models import EncoderDecoder

    keras.utils.set_random_seed(seed)
    model = EncoderDecoder(tiny_switch_config(vocab_size=16, track_router_metrics=True))
    model.compile(**model.compile_defaults())
    tokens = np.random.default_rng(seed).integers(2, 16, size=(rows, 6)).astype("int32")
    return model, {
        "encoder_input_tokens": tokens,
        "decoder_input_tokens": tokens,
        "decoder_target_tokens": tokens,
    }
