"""Configs from before the sparse-FFN spec: an `operative_config.gin` holding the flat
`T5Config` MoE fields is read (as keras-moe-eval reads it) as the model it trained,
and a dense JSON config loads whatever stale MoE fields it carries."""

import functools
import json

import numpy as np
import pytest

import gin
from keras_moe import GShardFeedForward, SwitchFeedForward
from keras_moe.gin_config import GinConfigError, parse_gin
from keras_moe.models import EncoderDecoder, T5Config

# The T5Config part of the operative_config.gin that `keras-moe-train` wrote for
# tiny_local.gin with d_model 32, 2 + 2 layers and 4 experts before the spec: every
# field, defaults included, in gin's operative-config layout.
OLD_T5CONFIG = """
T5Config.activation = 'relu'
T5Config.aux_loss_factor = 0.01
T5Config.d_ff = 64
T5Config.d_kv = 16
T5Config.d_model = 32
T5Config.decoder_sparse_layers = None
T5Config.decoder_sparse_step = 2
T5Config.decoder_start_id = 0
T5Config.dispatch = 'auto'
T5Config.dropout_rate = 0.0
T5Config.encoder_sparse_layers = None
T5Config.encoder_sparse_step = 2
T5Config.eos_id = 1
T5Config.eval_capacity_factor = 2.0
T5Config.expert_activation = None
T5Config.expert_d_ff = None
T5Config.expert_dropout_rate = 0.0
T5Config.group_size = 'batch'
T5Config.init_scale = 1.0
T5Config.jitter_noise = 0.0
T5Config.layer_norm_epsilon = 1e-06
T5Config.min_expert_capacity = 4
T5Config.moe_type = 'switch'
T5Config.num_decoder_layers = 2
T5Config.num_encoder_layers = 2
T5Config.num_experts = 4
T5Config.num_heads = 2
T5Config.pad_id = 0
T5Config.relative_attention_max_distance = 128
T5Config.relative_attention_num_buckets = 32
T5Config.router_bias = False
T5Config.router_dtype = 'float32'
T5Config.router_init_scale = None
T5Config.scale_decoder_outputs = None
T5Config.tie_word_embeddings = False
T5Config.track_router_metrics = True
T5Config.train_capacity_factor = 1.25
T5Config.vocab_size = 8100
T5Config.z_loss_factor = 0.001
"""

OLD_OPERATIVE_CONFIG = (
    """import keras_moe.models.gin_configurables
import keras_moe.training.gin_configurables as keras_moe2

# Macros:
# ==============================================================================
BATCH_SIZE = 4
LEARNING_RATE = 0.003
MIXTURE_OR_TASK_NAME = 'embedded_span_corruption'
OPTIMIZER = 'adam'
TASK_FEATURE_LENGTHS = {'inputs': 64, 'targets': 14}
TRAIN_STEPS = 2

# Parameters for build_model:
# ==============================================================================
build_model.compile = False
build_model.config = @T5Config()
build_model.learning_rate = 0.001

# Parameters for denoise:
# ==============================================================================
# None.

# Parameters for make_optimizer:
# ==============================================================================
make_optimizer.learning_rate = %LEARNING_RATE
make_optimizer.name = %OPTIMIZER

# Parameters for T5Config:
# ==============================================================================
"""
    + OLD_T5CONFIG
    + """
# Parameters for train:
# ==============================================================================
train.batch_size = %BATCH_SIZE
train.feature_lengths = %TASK_FEATURE_LENGTHS
train.optimizer = @make_optimizer
train.task = %MIXTURE_OR_TASK_NAME
train.train_steps = %TRAIN_STEPS
"""
)

# The same model written with the spec, by hand: the old fields' values as the
# Switch layer's arguments (expert_d_ff None -> d_ff, expert_activation None -> activation).
REFERENCE = T5Config(
    vocab_size=8100,
    d_model=32,
    num_heads=2,
    d_kv=16,
    d_ff=64,
    num_encoder_layers=2,
    num_decoder_layers=2,
    activation="relu",
    encoder_sparse_step=2,
    decoder_sparse_step=2,
    track_router_metrics=True,
    sparse_ffn=functools.partial(
        SwitchFeedForward,
        num_experts=4,
        d_ff=64,
        activation="relu",
        train_capacity_factor=1.25,
        eval_capacity_factor=2.0,
        min_expert_capacity=4,
        group_size="batch",
        jitter_noise=0.0,
        expert_dropout_rate=0.0,
        init_scale=1.0,
        router_init_scale=None,
        aux_loss_factor=0.01,
        z_loss_factor=0.001,
        dispatch="auto",
        router_bias=False,
        router_dtype="float32",
    ),
)


@pytest.fixture(autouse=True)
def _clean_gin():
    gin.clear_config()
    yield
    gin.clear_config()


def _parse_as_eval(path):
    # keras_moe.training.eval_cli.main's parse of <model_dir>/operative_config.gin.
    import keras_moe.training.train_configurables  # noqa: F401
    from keras_moe import tasks  # noqa: F401

    return parse_gin([str(path)], [], [], skip_unknown=True, check_required=False)


def _weights(model):
    tokens = np.ones((1, 6), "int32")
    model({"encoder_input_tokens": tokens, "decoder_input_tokens": tokens})
    return [(v.path, tuple(v.shape)) for v in model.weights]


def test_an_old_operative_config_is_read_as_the_model_it_trained(tmp_path):
    path = tmp_path / "operative_config.gin"
    path.write_text(OLD_OPERATIVE_CONFIG)
    config = _parse_as_eval(path)
    assert config == REFERENCE
    from keras_moe.gin_config.model_configurables import build_model

    model = build_model()  # what keras-moe-eval restores the checkpoint into
    ffn = model.encoder_layers[1].ffn
    assert type(ffn).__name__ == "SwitchFeedForward" and ffn.num_experts == 4
    assert (ffn.experts.d_ff, ffn.experts.activation) == (64, "relu")
    assert _weights(model) == _weights(EncoderDecoder(REFERENCE))
    assert gin.get_bindings("train")["task"] == "embedded_span_corruption"


def test_an_old_model_file_in_block_syntax_with_macros(tmp_path):
    # The old models/switch_tiny.gin, its expert count from a macro.
    path = tmp_path / "old_switch_tiny.gin"
    path.write_text("""include 'models/tiny.gin'
NUM_EXPERTS = 8
T5Config:
    activation = "relu"
    moe_type = "switch"
    num_experts = %NUM_EXPERTS
    encoder_sparse_step = 2
    decoder_sparse_step = 2
""")
    old = parse_gin(str(path))
    assert old == parse_gin("switch_tiny.gin")  # today's file for that model
    gshard = parse_gin(
        "tiny.gin",
        [
            "T5Config.moe_type = 'gshard'",
            "T5Config.num_experts = 4",
            "T5Config.expert_d_ff = 32",
            "T5Config.decoder_sparse_step = 1",
        ],
    )
    assert gshard.sparse_ffn["class_name"] == "keras_moe>GShardFeedForward"
    assert gshard.num_experts == 4 and gshard.sparse_option("d_ff") == 32
    assert gshard.sparse_option("train_capacity_factor") == 1.25  # the old T5Config default
    assert gshard.resolved_encoder_sparse_layers() == ()


@pytest.mark.parametrize("moe_type", [None, "switch", "gshard"])
def test_an_old_dense_operative_config_with_stale_moe_fields_is_dense(tmp_path, moe_type):
    text = (
        OLD_OPERATIVE_CONFIG.replace(
            "T5Config.encoder_sparse_step = 2", "T5Config.encoder_sparse_step = 0"
        )
        .replace("T5Config.decoder_sparse_step = 2", "T5Config.decoder_sparse_step = 0")
        .replace("T5Config.num_experts = 4", "T5Config.num_experts = 0")
        .replace("T5Config.moe_type = 'switch'", f"T5Config.moe_type = {moe_type!r}")
    )
    path = tmp_path / "operative_config.gin"
    path.write_text(text)
    config = _parse_as_eval(path)
    assert config == REFERENCE.replace(
        sparse_ffn=None, encoder_sparse_step=0, decoder_sparse_step=0
    )
    assert not config.is_sparse


def test_an_old_dense_json_config_with_stale_moe_fields_loads():
    old = dict(
        REFERENCE.replace(sparse_ffn=None, encoder_sparse_step=0, decoder_sparse_step=0).to_dict(),
        moe_type="switch",
        num_experts=0,
        expert_d_ff=None,
        aux_loss_factor=0.01,
    )
    for key in ("sparse_ffn", "encoder_sparse_ffn", "decoder_sparse_ffn"):
        old.pop(key)
    config = T5Config.from_dict(json.loads(json.dumps(old)))
    assert not config.is_sparse and config.num_experts == 0
    assert config.d_model == 32 and config.sparse_ffn is None


def test_flat_fields_with_a_sparse_ffn_name_the_layers_own_binding():
    with pytest.raises(
        GinConfigError,
        match=r"`T5Config.num_experts` is no longer a field of "
        r"T5Config: .* bind `GShardFeedForward.num_experts = \.\.\.` instead",
    ):
        parse_gin("gshard_top2_base.gin", "T5Config.num_experts = 16")
    with pytest.raises(GinConfigError, match=r"bind `encoder/SwitchFeedForward.d_ff = \.\.\.`"):
        parse_gin(
            "tiny.gin",
            [
                "T5Config.encoder_sparse_step = 2",
                "T5Config.encoder_sparse_ffn = @encoder/SwitchFeedForward",
                "encoder/SwitchFeedForward.num_experts = 2",
                "T5Config.expert_d_ff = 16",
            ],
        )
    # Without the moe_type every old file bound, nothing says which layer it was.
    with pytest.raises(
        GinConfigError,
        match=r"bind `T5Config.sparse_ffn = @SwitchFeedForward` "
        r"\(or @GShardFeedForward\) and `SwitchFeedForward.aux_loss_factor",
    ):
        parse_gin("tiny.gin", "T5Config.aux_loss_factor = 0.1")


def test_the_json_and_gin_translations_agree():
    from keras_moe.models.config import upgrade_flat_moe_fields

    old = dict(
        moe_type="gshard",
        num_experts=4,
        expert_activation="gelu",
        jitter_noise=0.01,
        router_bias=True,
        d_ff=64,
        activation="relu",
        encoder_sparse_step=2,
    )
    from_json = T5Config.from_dict(dict(old, d_model=32, num_heads=2, d_kv=16, vocab_size=100))
    from_gin = parse_gin(
        "t5_1_1_small.gin",
        [
            f"T5Config.{k} = {v!r}"
            for k, v in dict(old, d_model=32, num_heads=2, d_kv=16, vocab_size=100).items()
        ],
    )
    assert from_gin.sparse_ffn == from_json.sparse_ffn
    assert T5Config(**upgrade_flat_moe_fields(old)).sparse_ffn == from_json.sparse_ffn
    assert from_gin.sparse_ffn["class_name"] == "keras_moe>GShardFeedForward"
    assert (
        from_gin.sparse_ffn
        == T5Config(
            d_model=32,
            sparse_ffn=functools.partial(
                GShardFeedForward,
                4,
                64,
                activation="gelu",
                jitter_noise=0.01,
                router_bias=True,
                train_capacity_factor=1.25,
            ),
            encoder_sparse_step=2,
        ).sparse_ffn
    )
