import os

import pytest

import gin
from keras_moe.gin_config import GinConfigError, parse_gin, resolve
from keras_moe.layers.moe import MoeLayer
from keras_moe.models import count_params

NAMES = [
    "t5_1_1_small",
    "t5_1_1_base",
    "t5_1_1_large",
    "switch_base_8",
    "switch_base_16",
    "switch_base_32",
    "switch_base_64",
    "switch_base_128",
    "switch_large_128",
    "gshard_top2_base",
    "tiny",
    "switch_tiny",
    "fine_grained_base",
    "fine_grained_tiny",
]


@pytest.fixture(autouse=True)
def _clean_gin():
    gin.clear_config()
    yield
    gin.clear_config()


def _config(name, bindings=()):
    return parse_gin([name], bindings)


@pytest.mark.parametrize("name", NAMES)
def test_gin_files_resolve_and_parse(name):
    path = resolve(name)
    assert os.path.isfile(path) and path.endswith(f"models/{name}.gin")
    assert resolve(f"models/{name}") == path
    config = _config(name)
    assert count_params(config) > 0
    if name.startswith("switch"):
        assert config.sparse_ffn["class_name"] == "keras_moe>SwitchFeedForward"
        assert config.resolved_encoder_sparse_layers() == tuple(
            range(1, config.num_encoder_layers, 2)
        )
    if name.startswith("switch_base_"):
        assert config.num_experts == int(name.rsplit("_", 1)[1])
    if name == "gshard_top2_base":
        assert config.sparse_ffn["class_name"] == "keras_moe>GShardFeedForward"
    if name.startswith("fine_grained"):  # k experts of d_ff / k: the dense FLOPs per token
        spec = config.sparse_ffn_view("encoder")
        assert spec.class_name == "keras_moe>TopKFeedForward"
        assert spec.get("k") * spec.d_ff == config.d_ff and spec.num_experts == 32


def test_resolve_unknown_name():
    with pytest.raises(GinConfigError, match="not found"):
        resolve("no_such_model")


def test_build_switch_tiny_with_bindings():
    from keras_moe.gin_config.model_configurables import build_model

    parse_gin(
        ["switch_tiny"],
        [
            "SwitchFeedForward.num_experts = 4",
            "T5Config.vocab_size = 100",
            "T5Config.decoder_sparse_step = 1",
        ],
    )
    model = build_model()
    assert model.config.num_experts == 4 and model.config.vocab_size == 100
    assert [isinstance(b.ffn, MoeLayer) for b in model.encoder_layers] == [False, True]
    assert [isinstance(b.ffn, MoeLayer) for b in model.decoder_layers] == [True, True]
    assert model.count_params() == count_params(model.config)
