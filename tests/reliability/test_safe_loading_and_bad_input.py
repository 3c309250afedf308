"""Safe loading (.keras safe mode, gin only binds registered names) and bad input errors."""

import functools
import os
import sys

import keras
import numpy as np
import pytest

from keras_moe import SwitchFeedForward
from keras_moe.gin_config import GinConfigError, parse_gin
from keras_moe.models import T5Config, build_model
from keras_moe.training.errors import TrainingConfigError


def _tiny():
    return T5Config(vocab_size=64, d_model=16, num_heads=2, d_kv=8, d_ff=32,
                    num_encoder_layers=1, num_decoder_layers=1, encoder_sparse_step=1,
                    decoder_sparse_step=1,
                    sparse_ffn=functools.partial(SwitchFeedForward, num_experts=4, d_ff=32,
                                                 activation="gated-gelu"))


def _inputs(high=60):
    rng = np.random.default_rng(0)
    return {"encoder_input_tokens": rng.integers(2, high, (2, 7)).astype("int32"),
            "decoder_input_tokens": rng.integers(2, 60, (2, 5)).astype("int32")}


def test_keras_moe_model_loads_in_safe_mode_and_a_lambda_model_is_refused(tmp_path):
    model = build_model(_tiny())
    x = _inputs()
    expected = model(x)
    path = str(tmp_path / "moe.keras")
    model.save(path)
    loaded = keras.saving.load_model(path, safe_mode=True)
    np.testing.assert_allclose(loaded(x), expected, rtol=1e-5, atol=1e-6)

    inputs = keras.Input((3,))
    evil = keras.Model(inputs, keras.layers.Lambda(lambda t: t * 2)(inputs))
    evil_path = str(tmp_path / "lambda.keras")
    evil.save(evil_path)
    with pytest.raises(ValueError, match="(?i)unsafe|safe_mode"):
        keras.saving.load_model(evil_path, safe_mode=True)


def test_gin_file_binding_an_unregistered_callable_is_rejected(tmp_path):
    import gin

    for text in ("os.system.command = 'touch pwned'\n",
                 "train.optimizer = @os.system()\n",
                 "import os\nMIXTURE_OR_TASK_NAME = @system()\n"):
        bad = tmp_path / "bad.gin"
        bad.write_text("include 'runs/tiny_local.gin'\n" + text)
        gin.clear_config()
        with pytest.raises(GinConfigError):
            parse_gin([str(bad)])
        assert not os.path.exists("pwned")
    gin.clear_config()


@pytest.mark.parametrize("binding,message", [
    ("T5Config.d_model = 'wide'", "d_model"),
    ("T5Config.sparse_ffn = 'switch'", "sparse_ffn"),
    ("SwitchFeedForward.router_dtype = 'int8'", "router_dtype"),
    ("TASK_FEATURE_LENGTHS = {'inputs': 64}", "TASK_FEATURE_LENGTHS"),
    ("TASK_FEATURE_LENGTHS = {'inputs': 64, 'targets': -1}", "targets"),
    ("BATCH_SIZE = 0", "batch_size"),
])
def test_bad_bindings_fail_before_the_model_dir_is_written(tmp_path, binding, message):
    from tests.reliability import helpers

    with pytest.raises((TrainingConfigError, GinConfigError), match=message):
        helpers.train_in_process(tmp_path / "run", [binding])
    assert not os.path.exists(tmp_path / "run") or os.listdir(tmp_path / "run") == []


@pytest.mark.slow
def test_token_ids_beyond_vocab_size_are_named():
    import tensorflow as tf

    model = build_model(_tiny())
    with pytest.raises(ValueError, match="vocab_size=64"):
        model(_inputs(high=200))
    model.compile(**model.compile_defaults())
    x = _inputs(high=200)
    y = np.ones((2, 5), "int32")
    with pytest.raises(tf.errors.InvalidArgumentError, match="vocab_size=64"):
        model.fit(x, y, verbose=0)


def test_invalid_layer_and_model_arguments_name_the_argument():
    import keras_moe

    with pytest.raises(ValueError, match="num_experts"):
        keras_moe.SwitchFeedForward(num_experts=0, d_ff=8)
    with pytest.raises(ValueError, match="vocab_size"):
        T5Config(vocab_size=0)



def test_gin_imports_outside_the_allow_list_are_refused_before_running(tmp_path):
    import gin

    marker = tmp_path / "imported"
    module = tmp_path / "side_effect_module.py"
    module.write_text(f"open({str(marker)!r}, 'w').close()\n")
    bad = tmp_path / "bad.gin"
    bad.write_text("include 'runs/tiny_local.gin'\nimport side_effect_module\n")
    sys.path.insert(0, str(tmp_path))
    try:
        gin.clear_config()
        with pytest.raises(GinConfigError, match=r"side_effect_module.*--gin_allow_import"):
            parse_gin([str(bad)])
        assert not marker.exists()  # the module never ran
        gin.clear_config()
        parse_gin([str(bad)], allowed_imports=["side_effect_module"])
        assert marker.exists()
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("side_effect_module", None)
        gin.clear_config()


def test_gin_import_refusal_names_the_flag_on_the_command_line(tmp_path, capsys):
    from keras_moe.training import train_cli

    bad = tmp_path / "bad.gin"
    bad.write_text("include 'runs/tiny_local.gin'\nfrom __gin__ import dynamic_registration\n")
    assert train_cli.main(["--gin_file", str(bad), "--model_dir", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert "--gin_allow_import __gin__" in err and "bad.gin:2" in err
    assert not (tmp_path / "run").exists()
