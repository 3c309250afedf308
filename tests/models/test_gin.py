import os

import gin
import pytest

from keras_moe.models import count_params, gin_path
from keras_moe.moe import MoeLayer

NAMES = ["t5_1_1_small", "t5_1_1_base", "t5_1_1_large", "switch_base_8", "switch_base_16",
         "switch_base_32", "switch_base_64", "switch_base_128", "switch_large_128",
         "gshard_top2_base", "tiny", "switch_tiny"]


@pytest.fixture(autouse=True)
def _clean_gin():
    gin.clear_config()
    yield
    gin.clear_config()


def _config(name, bindings=()):
    from keras_moe.models import gin_configurables

    gin_configurables.parse_gin([name], bindings)
    return gin.query_parameter("build_model.config").scoped_configurable_fn()


@pytest.mark.parametrize("name", NAMES)
def test_gin_files_resolve_and_parse(name):
    path = gin_path(name)
    assert os.path.isfile(path) and path.endswith(f"models/{name}.gin")
    assert gin_path(f"models/{name}") == path
    config = _config(name)
    assert count_params(config) > 0
    if name.startswith("switch"):
        assert config.moe_type == "switch"
        assert config.resolved_encoder_sparse_layers() == tuple(
            range(1, config.num_encoder_layers, 2))
    if name.startswith("switch_base_"):
        assert config.num_experts == int(name.rsplit("_", 1)[1])
    if name == "gshard_top2_base":
        assert config.moe_type == "gshard"


def test_gin_path_unknown_name():
    with pytest.raises(ValueError, match="not found"):
        gin_path("no_such_model")


def test_build_switch_tiny_with_bindings():
    from keras_moe.models import build_model, gin_configurables

    gin_configurables.parse_gin(["switch_tiny"], ["NUM_EXPERTS = 4", "VOCAB_SIZE = 100",
                                                  "DECODER_SPARSE_STEP = 1"])
    model = build_model()
    assert model.config.num_experts == 4 and model.config.vocab_size == 100
    assert [isinstance(b.ffn, MoeLayer) for b in model.encoder_layers] == [False, True]
    assert [isinstance(b.ffn, MoeLayer) for b in model.decoder_layers] == [True, True]
    assert model.count_params() == count_params(model.config)
