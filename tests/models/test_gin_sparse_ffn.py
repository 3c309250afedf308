"""Every router and routing policy of the library reaches a T5 model from gin, through
the injected sparse FFN (`T5Config.sparse_ffn = @...`) and per-stack scopes."""

import numpy as np
import pytest

import gin
import keras_moe
from keras_moe.gin_config import parse_gin
from keras_moe.models import EncoderDecoder

TINY = [
    "T5Config.vocab_size = 32",
    "T5Config.d_model = 16",
    "T5Config.num_heads = 2",
    "T5Config.d_kv = 8",
    "T5Config.d_ff = 32",
    "T5Config.num_encoder_layers = 2",
    "T5Config.num_decoder_layers = 2",
    "T5Config.encoder_sparse_step = 2",
    "T5Config.decoder_sparse_step = 2",
]

SWITCH = [
    "T5Config.sparse_ffn = @SwitchFeedForward",
    "SwitchFeedForward.num_experts = 4",
    "SwitchFeedForward.d_ff = 8",
]
GSHARD = [
    "T5Config.sparse_ffn = @GShardFeedForward",
    "GShardFeedForward.num_experts = 4",
    "GShardFeedForward.d_ff = 8",
]
GENERAL = [
    "MoeLayer.experts = @FeedForwardExperts()",
    "FeedForwardExperts.num_experts = 4",
    "FeedForwardExperts.d_ff = 8",
]


@pytest.fixture(autouse=True)
def _clean_gin():
    gin.clear_config()
    yield
    gin.clear_config()


def _model(bindings):
    model = EncoderDecoder(parse_gin(["tiny.gin"], TINY + bindings))
    tokens = np.random.default_rng(0).integers(2, 32, (2, 6)).astype("int32")
    logits = model({"encoder_input_tokens": tokens, "decoder_input_tokens": tokens})
    assert np.all(np.isfinite(np.asarray(logits)))
    encoder, decoder = (stack[1].ffn for stack in (model.encoder_layers, model.decoder_layers))
    return model, encoder, decoder


def test_switch_with_its_own_bindings():
    _, encoder, decoder = _model(
        SWITCH
        + [
            "SwitchFeedForward.jitter_noise = 0.01",
            "SwitchFeedForward.router_bias = True",
            "SwitchFeedForward.group_size = 'sequence'",
            "SwitchFeedForward.dispatch = 'gather'",
            "SwitchFeedForward.router_dtype = 'bfloat16'",
            "SwitchFeedForward.aux_loss_factor = 0.5",
        ]
    )
    for layer in (encoder, decoder):
        assert type(layer) is keras_moe.SwitchFeedForward
        assert type(layer.router) is keras_moe.SwitchRouter and layer.router.use_bias
        assert layer.router.jitter_noise == 0.01 and layer.router.dtype_policy.name == "bfloat16"
        assert (layer.group_size, layer.dispatch, layer.aux_loss_factor) == (
            "sequence",
            "gather",
            0.5,
        )
    assert decoder.causal and not encoder.causal


def test_batch_prioritized_routing_in_the_encoder_only():
    _, encoder, decoder = _model(
        SWITCH
        + [
            "T5Config.encoder_sparse_ffn = @encoder/SwitchFeedForward",
            "encoder/SwitchFeedForward.batch_prioritized_routing = True",
        ]
    )
    assert encoder.router.batch_prioritized_routing
    assert not decoder.router.batch_prioritized_routing
    assert encoder.num_experts == decoder.num_experts == 4  # unscoped bindings reach both


def test_a_causal_stack_refuses_batch_prioritized_routing():
    with pytest.raises(ValueError, match="sparse_ffn.*batch_prioritized_routing"):
        parse_gin(
            ["tiny.gin"], TINY + SWITCH + ["SwitchFeedForward.batch_prioritized_routing = True"]
        )


@pytest.mark.parametrize(
    "policy,eval_policy,threshold,gates",
    [
        ("random", "all", None, "before_capacity"),
        ("all", "threshold", 0.3, "after_capacity"),
        ("threshold", "threshold", 0.2, "before_capacity"),
    ],
)
def test_gshard_second_expert_policies(policy, eval_policy, threshold, gates):
    _, encoder, decoder = _model(
        GSHARD
        + [
            f"GShardFeedForward.second_expert_policy = '{policy}'",
            f"GShardFeedForward.eval_second_expert_policy = '{eval_policy}'",
            f"GShardFeedForward.second_expert_threshold = {threshold}",
            f"GShardFeedForward.normalize_gates = '{gates}'",
        ]
    )
    for layer in (encoder, decoder):
        assert type(layer.router) is keras_moe.Top2Router
        router = layer.router
        assert (
            router.second_expert_policy,
            router.eval_second_expert_policy,
            router.second_expert_threshold,
            router.normalize_gates,
        ) == (policy, eval_policy, threshold, gates)


def test_top_k_router_through_a_general_moe_layer():
    model, encoder, decoder = _model(
        GENERAL
        + [
            "T5Config.sparse_ffn = @MoeLayer",
            "MoeLayer.router = @TopKRouter()",
            "TopKRouter.num_experts = 4",
            "TopKRouter.k = 3",
            "TopKRouter.normalize_top_k = True",
        ]
    )
    assert encoder.router is not decoder.router  # each layer its own router
    for layer in (encoder, decoder):
        assert type(layer.router) is keras_moe.TopKRouter
        assert layer.router.k == 3 and layer.router.normalize_top_k
    # The spec is plain data: the model rebuilds from its config with the same router.
    again = EncoderDecoder.from_config(model.get_config())
    assert again.encoder_layers[1].ffn.router.k == 3


def test_expert_choice_in_the_encoder_with_a_switch_decoder():
    _, encoder, decoder = _model(
        GENERAL
        + SWITCH
        + [
            "T5Config.encoder_sparse_ffn = @MoeLayer",
            "MoeLayer.router = @ExpertChoiceRouter()",
            "ExpertChoiceRouter.num_experts = 4",
        ]
    )
    assert type(encoder.router) is keras_moe.ExpertChoiceRouter
    assert type(decoder.router) is keras_moe.SwitchRouter


def test_expert_choice_cannot_be_the_decoders():
    with pytest.raises(ValueError, match="sparse_ffn.*causal"):
        parse_gin(
            ["tiny.gin"],
            TINY
            + GENERAL
            + [
                "T5Config.sparse_ffn = @MoeLayer",
                "MoeLayer.router = @ExpertChoiceRouter()",
                "ExpertChoiceRouter.num_experts = 4",
            ],
        )


def test_deepseek_v3_router_through_a_general_moe_layer():
    model, encoder, decoder = _model(
        GENERAL
        + [
            "T5Config.sparse_ffn = @MoeLayer",
            "MoeLayer.router = @TopKRouter()",
            "MoeLayer.dispatch = 'dropless'",
            "TopKRouter.num_experts = 4",
            "TopKRouter.k = 2",
            "TopKRouter.score_function = 'sigmoid'",
            "TopKRouter.normalize_top_k = True",
            "TopKRouter.routed_scaling_factor = 2.5",
            "TopKRouter.n_group = 2",
            "TopKRouter.topk_group = 1",
            "TopKRouter.selection_bias = True",
            "TopKRouter.bias_update_rate = 0.001",
        ]
    )
    expected = dict(
        k=2,
        score_function="sigmoid",
        normalize_top_k=True,
        routed_scaling_factor=2.5,
        n_group=2,
        topk_group=1,
        selection_bias=True,
        bias_update_rate=0.001,
    )
    again = EncoderDecoder.from_config(model.get_config())
    for layer in (encoder, decoder, again.encoder_layers[1].ffn):
        config = layer.router.get_config()
        assert {name: config[name] for name in expected} == expected
    assert [w.name for w in encoder.router.non_trainable_weights] == ["expert_bias"]


@pytest.mark.parametrize(
    "binding,name,why",
    [
        ("SwitchFeedForward.trainable = False", "trainable", "layer.trainable = False"),
        ('SwitchFeedForward.dtype = "bfloat16"', "dtype", "train.dtype_policy"),
        ("SwitchFeedForward.causal = True", "causal", "the decoder's MoE layers are causal"),
        ('SwitchFeedForward.metrics_prefix = "moe"', "metrics_prefix", "named after its place"),
        ('decoder/SwitchFeedForward.name = "mine"', "name", "names each layer"),
        (
            "SwitchFeedForward.track_metrics = False",
            "track_metrics",
            "T5Config.track_router_metrics",
        ),
    ],
)
def test_arguments_the_model_decides_are_refused_by_name(binding, name, why):
    """They were accepted, written to operative_config.gin as applied, then dropped."""
    with pytest.raises(ValueError) as raised:
        parse_gin(["tiny.gin"], TINY + SWITCH + [binding])
    message = str(raised.value)
    assert f"gin binding {binding.split(' = ')[0]}: `{name}`" in message, message
    assert "set by the model" in message and why in message, message


def test_model_decided_arguments_given_in_python_are_refused():
    import functools

    from keras_moe.models import T5Config

    for sparse_ffn, name in (
        (functools.partial(keras_moe.SwitchFeedForward, 4, 8, causal=True), "causal"),
        (keras_moe.SwitchFeedForward(4, 8, trainable=False), "trainable"),
        (keras_moe.SwitchFeedForward(4, 8, dtype="bfloat16"), "dtype"),
        (keras_moe.SwitchFeedForward(4, 8, metrics_prefix="x"), "metrics_prefix"),
    ):
        with pytest.raises(
            TypeError,
            match=rf"`{name}` of a model's MoE layers is set by the "
            "model",
        ):
            T5Config(
                vocab_size=32,
                d_model=16,
                num_heads=2,
                d_kv=8,
                d_ff=32,
                num_encoder_layers=2,
                num_decoder_layers=2,
                encoder_sparse_step=2,
                decoder_sparse_step=2,
                sparse_ffn=sparse_ffn,
            )
