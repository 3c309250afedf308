"""Files written by the code before the blocks took explicit arguments
(`fixtures/make_legacy_t5.py`) load with the current code and give the
outputs that code computed."""

import json
import os

import keras
import numpy as np
import pytest

from keras_moe import SwitchFeedForward
from keras_moe.layers.dense_feedforward import DenseFeedForward
from keras_moe.models import DecoderBlock, EncoderBlock, EncoderDecoder
from tests.models.fixtures.make_legacy_t5 import inputs

HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures")


@pytest.fixture(scope="module")
def reference():
    with np.load(os.path.join(HERE, "legacy_t5.npz")) as data:
        return {k: data[k] for k in data.files}


def _tokens():
    data = inputs()
    return {k: data[k] for k in ("encoder_input_tokens", "decoder_input_tokens")}


def test_legacy_keras_file_gives_the_stored_logits(reference):
    model = keras.saving.load_model(os.path.join(HERE, "legacy_t5.keras"))
    logits = np.asarray(model(_tokens()), "float64")
    np.testing.assert_allclose(logits, reference["logits"], rtol=1e-5, atol=1e-6)


def test_legacy_weights_file_loads_by_path(reference):
    config = keras.saving.load_model(os.path.join(HERE, "legacy_t5.keras")).config
    model = EncoderDecoder(config)
    assert [v.path for v in model.weights] == list(reference["model_weight_paths"])
    model.load_weights(os.path.join(HERE, "legacy_t5.weights.h5"))
    logits = np.asarray(model(_tokens()), "float64")
    np.testing.assert_allclose(logits, reference["logits"], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    "side,ffn_class", [("encoder", SwitchFeedForward), ("decoder", DenseFeedForward)]
)
def test_whole_config_block_configs_still_load(reference, side, ffn_class):
    with open(os.path.join(HERE, "legacy_blocks.json")) as f:
        old = json.load(f)[side]
    assert "config" in old and "layer_index" in old  # the earlier form
    block_class = EncoderBlock if side == "encoder" else DecoderBlock
    block = block_class.from_config(old)
    assert type(block.ffn) is ffn_class and block.name == old["name"]
    data = inputs()
    x, memory = data["x"], data["memory"]
    self_bias = np.triu(np.full((5, 5), -1e9, "float32"), 1)[None, None]

    def call(b):
        if side == "encoder":
            return b(x, bias=np.zeros((1, 2, 5, 5), "float32"))
        return b(
            x,
            self_bias=self_bias,
            encoder_outputs=memory,
            cross_bias=np.zeros((1, 2, 5, 6), "float32"),
        )

    call(block)
    prefix = f"{side}_w"
    weights = [
        reference[f"{prefix}{i}"] for i in range(sum(k.startswith(prefix) for k in reference))
    ]
    block.set_weights(weights)  # in the order the earlier code had them
    np.testing.assert_allclose(
        np.asarray(call(block), "float64"), reference[f"{side}_block_out"], rtol=1e-5, atol=1e-6
    )
    # It saves in the explicit form, which reloads the same FFN class.
    again = block_class.from_config(block.get_config())
    assert "config" not in block.get_config() and type(again.ffn) is ffn_class


def test_a_block_reloads_with_its_own_ffn():
    """A block saves its FFN, not the model's config: a dense block reloads dense
    (the earlier form rebuilt the FFN from the whole config and the index)."""
    x = inputs()["x"]
    bias = np.zeros((1, 2, 5, 5), "float32")
    for ffn in (
        DenseFeedForward(48, "relu", name="ffn"),
        SwitchFeedForward(3, 8, track_metrics=False, name="ffn"),
    ):
        block = EncoderBlock(8, 2, 4, ffn=ffn, name="encoder_layer_0")
        block(x, bias=bias)
        again = EncoderBlock.from_config(block.get_config())
        again(x, bias=bias)
        assert type(again.ffn) is type(ffn) and again.ffn.get_config() == ffn.get_config()
        assert [v.path for v in again.weights] == [v.path for v in block.weights]
        again.set_weights(block.get_weights())
        np.testing.assert_allclose(
            np.asarray(again(x, bias=bias)), np.asarray(block(x, bias=bias)), rtol=1e-6
        )


@pytest.mark.parametrize("form", ["partial", "class_kwargs_dict", "template"])
def test_validating_a_config_builds_no_layer(monkeypatch, form):
    import functools

    from keras_moe.models import T5Config

    made = []
    init = keras.layers.Layer.__init__

    def counting(self, *args, **kwargs):
        made.append(type(self).__name__)
        init(self, *args, **kwargs)

    sparse_ffn = {
        "partial": lambda: functools.partial(SwitchFeedForward, num_experts=4, d_ff=8),
        "class_kwargs_dict": lambda: {
            "class_name": "keras_moe>SwitchFeedForward",
            "config": {"num_experts": 4, "d_ff": 8},
        },
        "template": lambda: SwitchFeedForward(4, 8),
    }[form]()
    monkeypatch.setattr(keras.layers.Layer, "__init__", counting)
    config = T5Config(
        d_model=16,
        num_heads=2,
        d_kv=8,
        d_ff=32,
        encoder_sparse_step=2,
        decoder_sparse_step=2,
        sparse_ffn=sparse_ffn,
    )
    config.replace(d_ff=64)
    assert made == [] and config.num_experts == 4
    with pytest.raises(ValueError, match=r"`sparse_ffn` \(SwitchFeedForward\): `num_experts`"):
        T5Config(
            encoder_sparse_step=1,
            sparse_ffn=functools.partial(SwitchFeedForward, num_experts=0, d_ff=8),
        )
    with pytest.raises(
        TypeError, match="`sparse_ffn`: SwitchFeedForward takes no argument `num_expert`"
    ):
        T5Config(
            encoder_sparse_step=1,
            sparse_ffn=functools.partial(SwitchFeedForward, num_expert=2, d_ff=8),
        )
    assert made == []


@pytest.mark.parametrize(
    "layer,name,bad",
    [
        ("SwitchFeedForward", "dispatch", "sorted"),
        ("SwitchFeedForward", "router_dtype", "float8"),
        ("SwitchFeedForward", "group_size", 0),
        ("SwitchFeedForward", "train_capacity_factor", 0),
        ("SwitchFeedForward", "eval_capacity_factor", -1.0),
        ("SwitchFeedForward", "min_expert_capacity", -1),
        ("SwitchFeedForward", "aux_loss_factor", -0.1),
        ("SwitchFeedForward", "z_loss_factor", "x"),
        ("SwitchFeedForward", "jitter_noise", 1.0),
        ("SwitchFeedForward", "expert_dropout_rate", 1.5),
        ("SwitchFeedForward", "init_scale", 0),
        ("SwitchFeedForward", "router_init_scale", -1.0),
        ("SwitchFeedForward", "shared_d_ff", 0),
        ("SwitchFeedForward", "activation", "swish"),
        ("SwitchFeedForward", "balance_loss", "batch"),
        ("SwitchFeedForward", "num_experts", 0),
        ("GShardFeedForward", "num_experts", 1),
        ("GShardFeedForward", "second_expert_policy", "best"),
        ("GShardFeedForward", "normalize_gates", "never"),
        ("GShardFeedForward", "second_expert_threshold", 1.5),
        ("TopKFeedForward", "k", 0),
        ("TopKFeedForward", "score_function", "tanh"),
        ("TopKFeedForward", "routed_scaling_factor", 0.0),
        ("TopKFeedForward", "bias_update_rate", -1.0),
    ],
)
def test_a_bad_argument_is_refused_by_the_config_in_the_layers_words(layer, name, bad):
    """T5Config refuses, without building a layer, what the layer's constructor
    refuses, with the same message: one validator (`MoeLayer.check_arguments`)."""
    import functools

    import keras_moe
    from keras_moe.models import T5Config

    layer_class = getattr(keras_moe, layer)
    arguments = {"num_experts": 4, "d_ff": 8, name: bad}
    with pytest.raises(ValueError, match=f"`{name}`") as by_the_layer:
        layer_class(**arguments)
    with pytest.raises(ValueError) as by_the_config:
        T5Config(encoder_sparse_step=1, sparse_ffn=functools.partial(layer_class, **arguments))
    assert str(by_the_config.value) == f"`sparse_ffn` ({layer}): {by_the_layer.value}"


def test_a_gate_without_a_shared_expert_is_refused_by_both():
    import functools

    import keras_moe
    from keras_moe.models import T5Config

    arguments = {"num_experts": 4, "d_ff": 8, "shared_expert_gate": True}
    with pytest.raises(ValueError, match="`shared_expert_gate=True` needs a shared expert"):
        keras_moe.SwitchFeedForward(**arguments)
    with pytest.raises(ValueError, match="`shared_expert_gate=True` needs a shared expert"):
        T5Config(
            encoder_sparse_step=1,
            sparse_ffn=functools.partial(keras_moe.SwitchFeedForward, **arguments),
        )
