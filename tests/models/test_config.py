import pytest

import gin
from keras_moe.layers.dense_feedforward import DenseFeedForward
from keras_moe.layers.moe import MoeLayer
from keras_moe.models import (
    EncoderDecoder,
    T5Config,
    count_params,
    hf_sparse_layers,
    sparse_layers_from_step,
)
from tests.models.helpers import tiny_config, tiny_switch_config


@pytest.mark.parametrize(
    "step,expected",
    [
        (0, ()),
        (1, (0, 1, 2, 3, 4, 5)),
        (2, (1, 3, 5)),
        (3, (2, 5)),
        (6, (5,)),
        (7, ()),
    ],
)
def test_sparse_step_rule(step, expected):
    assert sparse_layers_from_step(6, step) == expected


def test_hf_rule_differs_for_step_three_and_none():
    assert hf_sparse_layers(6, 2) == sparse_layers_from_step(6, 2)
    assert hf_sparse_layers(6, 1) == sparse_layers_from_step(6, 1)
    assert hf_sparse_layers(6, 3) == (1, 4)
    assert hf_sparse_layers(6, 6) == (1,)  # HF's "zero sparse layers" quirk


def _sparse_flags(model):
    enc = [isinstance(b.ffn, MoeLayer) for b in model.encoder_layers]
    dec = [isinstance(b.ffn, MoeLayer) for b in model.decoder_layers]
    return enc, dec


@pytest.mark.parametrize(
    "kwargs,enc,dec",
    [
        (dict(encoder_sparse_step=1, decoder_sparse_step=1), [1, 1, 1], [1, 1]),
        (dict(encoder_sparse_step=2, decoder_sparse_step=2), [0, 1, 0], [0, 1]),
        (dict(encoder_sparse_step=2, decoder_sparse_step=0), [0, 1, 0], [0, 0]),
        (dict(encoder_sparse_layers=[0, 2], decoder_sparse_layers=[0]), [1, 0, 1], [1, 0]),
        (
            dict(encoder_sparse_step=1, encoder_sparse_layers=[2], decoder_sparse_step=1),
            [0, 0, 1],
            [1, 1],
        ),
    ],
)
def test_built_model_placement(kwargs, enc, dec):
    model = EncoderDecoder(
        tiny_config(num_encoder_layers=3, moe_type="switch", num_experts=2, **kwargs)
    )
    got_enc, got_dec = _sparse_flags(model)
    assert got_enc == [bool(x) for x in enc]
    assert got_dec == [bool(x) for x in dec]
    for block in model.decoder_layers:
        if isinstance(block.ffn, MoeLayer):
            assert block.ffn.causal
        else:
            assert isinstance(block.ffn, DenseFeedForward)
    for block in model.encoder_layers:
        if isinstance(block.ffn, MoeLayer):
            assert not block.ffn.causal


@pytest.mark.parametrize(
    "kwargs,name",
    [
        (dict(d_model=16, num_heads=3, d_kv=None), "num_heads"),
        (dict(activation="swish"), "activation"),
        (
            dict(expert_activation="tanh", moe_type="switch", num_experts=2, encoder_sparse_step=1),
            "sparse_ffn` \\(SwitchFeedForward\\): `activation",
        ),
        (
            dict(moe_type="switch", num_experts=2, encoder_sparse_layers=[2]),
            "encoder_sparse_layers",
        ),
        (
            dict(moe_type="switch", num_experts=2, decoder_sparse_layers=[-1]),
            "decoder_sparse_layers",
        ),
        (
            dict(moe_type="switch", num_experts=2, decoder_sparse_layers=[1, 1]),
            "decoder_sparse_layers",
        ),
        (dict(sparse_ffn="switch", encoder_sparse_step=1), "sparse_ffn"),
        (
            dict(sparse_ffn=lambda **kwargs: DenseFeedForward(8), encoder_sparse_step=1),
            "sparse_ffn",
        ),
        (dict(encoder_sparse_step=2), "sparse_ffn"),
        (
            dict(moe_type="switch", num_experts=0, encoder_sparse_step=1),
            "sparse_ffn` \\(SwitchFeedForward\\): `num_experts",
        ),
        (
            dict(moe_type="gshard", num_experts=1, encoder_sparse_step=1),
            "sparse_ffn` \\(GShardFeedForward\\): `num_experts",
        ),
        (
            dict(
                moe_type="switch",
                num_experts=2,
                decoder_sparse_step=1,
                batch_prioritized_routing=True,
            ),
            "sparse_ffn` \\(SwitchFeedForward\\): `batch_prioritized_routing=True",
        ),
        (dict(encoder_sparse_step=-1), "encoder_sparse_step"),
        (dict(dropout_rate=1.0), "dropout_rate"),
    ],
)
def test_bad_configs_name_the_argument(kwargs, name):
    with pytest.raises(ValueError, match=f"`{name}"):
        tiny_config(**kwargs)


def test_d_kv_independent_of_heads():
    config = tiny_config(d_model=16, num_heads=3, d_kv=5)
    model = EncoderDecoder(config)
    assert tuple(model.encoder_layers[0].attention.query.shape) == (16, 15)
    assert tiny_config(d_model=16, num_heads=4, d_kv=None).head_dim == 4


@pytest.mark.parametrize(
    "config",
    [
        tiny_config(),
        tiny_config(tie_word_embeddings=True, activation="relu"),
        tiny_switch_config(),
        tiny_switch_config(
            moe_type="gshard", activation="gated-gelu", expert_d_ff=8, expert_activation="relu"
        ),
        tiny_switch_config(router_bias=True, tie_word_embeddings=True),
    ],
    ids=["dense", "tied-relu", "switch", "gshard", "router-bias"],
)
def test_analytic_count_matches_keras(config):
    assert count_params(config) == EncoderDecoder(config).count_params()


PUBLISHED = {  # name: (published parameter count, relative tolerance)
    "t5_1_1_small": (77e6, 0.02),
    "t5_1_1_base": (248e6, 0.01),
    "t5_1_1_large": (783e6, 0.01),
    "switch_base_128": (7.4e9, 0.02),
    "switch_large_128": (26.3e9, 0.02),
}


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_published_parameter_counts(name):
    from keras_moe.gin_config import parse_gin

    gin.clear_config()
    try:
        config = parse_gin([name])
    finally:
        gin.clear_config()
    count = count_params(config)
    published, tol = PUBLISHED[name]
    print(f"{name}: {count:,} parameters (published ~{published:,.0f})")
    assert abs(count - published) / published < tol


def test_config_saved_with_the_flat_moe_fields_loads_as_the_same_model():
    """A checkpoint's config.json from before the sparse-FFN spec (flat MoE fields,
    old defaults) gives the layers it gave then, and the same weights load."""
    import json

    import numpy as np

    old = dict(
        tiny_config().to_dict(),
        moe_type="gshard",
        num_experts=4,
        expert_d_ff=12,
        encoder_sparse_step=2,
        decoder_sparse_step=1,
        group_size=8,
        jitter_noise=0.01,
        router_bias=True,
        dispatch="gather",
    )
    for key in ("sparse_ffn", "encoder_sparse_ffn", "decoder_sparse_ffn"):
        old.pop(key)
    config = T5Config.from_dict(json.loads(json.dumps(old)))
    decoder_ffn = EncoderDecoder(config).decoder_layers[0].ffn
    assert type(decoder_ffn).__name__ == "GShardFeedForward" and decoder_ffn.causal
    assert (decoder_ffn.experts.d_ff, decoder_ffn.experts.activation) == (12, "gated-gelu")
    assert decoder_ffn.train_capacity_factor == 1.25  # T5Config's old default, not GShard's 1.0
    assert (decoder_ffn.group_size, decoder_ffn.pad_to_group_size) == (8, True)
    assert decoder_ffn.router.jitter_noise == 0.01 and decoder_ffn.router.use_bias
    assert decoder_ffn.dispatch == "gather"
    # The spec round-trips through JSON and builds weights of the same paths and shapes.
    again = T5Config.from_dict(json.loads(json.dumps(config.to_dict())))
    assert again == config
    a, b = EncoderDecoder(config), EncoderDecoder(again)
    tokens = {
        "encoder_input_tokens": np.ones((1, 8), "int32"),
        "decoder_input_tokens": np.ones((1, 8), "int32"),
    }
    a(tokens), b(tokens)
    assert [(v.path, v.shape) for v in a.weights] == [(v.path, v.shape) for v in b.weights]


def test_a_stack_keeps_its_own_sparse_ffn():
    from keras_moe import SwitchFeedForward

    config = tiny_switch_config(
        encoder_sparse_ffn=SwitchFeedForward(num_experts=2, d_ff=8, batch_prioritized_routing=True)
    )
    model = EncoderDecoder(config)
    encoder, decoder = model.encoder_layers[1].ffn, model.decoder_layers[0].ffn
    assert (encoder.num_experts, encoder.router.batch_prioritized_routing) == (2, True)
    assert (decoder.num_experts, decoder.router.batch_prioritized_routing) == (4, False)
    assert config.num_experts == 4 and count_params(config) == model.count_params()
