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
    return T5Config(
        vocab_size=64,
        d_model=16,
        num_heads=2,
        d_kv=8,
        d_ff=32,
        num_encoder_layers=1,
        num_decoder_layers=1,
        encoder_sparse_step=1,
        decoder_sparse_step=1,
        sparse_ffn=functools.partial(
            SwitchFeedForward, num_experts=4, d_ff=32, activation="gated-gelu"
        ),
    )


def _inputs(high=60):
    rng = np.random.default_rng(0)
    return {
        "encoder_input_tokens": rng.integers(2, high, (2, 7)).astype("int32"),
        "decoder_input_tokens": rng.integers(2, 60, (2, 5)).astype("int32"),
    }


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

    for text in (
        "os.system.command = 'touch pwned'\n",
        "train.optimizer = @os.system()\n",
        "import os\nMIXTURE_OR_TASK_NAME = @system()\n",
    ):
        bad = tmp_path / "bad.gin"
        bad.write_text("include 'runs/tiny_local.gin'\n" + text)
        gin.clear_config()
        with pytest.raises(GinConfigError):
            parse_gin([str(bad)])
        assert not os.path.exists("pwned")
    gin.clear_config()


@pytest.mark.e2e
@pytest.mark.parametrize(
    "binding,message",
    [
        ("T5Config.d_model = 'wide'", "d_model"),
        ("T5Config.sparse_ffn = 'switch'", "sparse_ffn"),
        ("SwitchFeedForward.router_dtype = 'int8'", "router_dtype"),
        ("TASK_FEATURE_LENGTHS = {'inputs': 64}", "TASK_FEATURE_LENGTHS"),
        ("TASK_FEATURE_LENGTHS = {'inputs': 64, 'targets': -1}", "targets"),
        ("BATCH_SIZE = 0", "batch_size"),
    ],
)
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


# A gin syntax error: (binding, where the error must point).
BAD_SYNTAX = [
    ('TASK_FEATURE_LENGTHS = {"inputs": 64', "'{' at column 24 is never closed"),
    ('TASK_FEATURE_LENGTHS = {"inputs": 64]', "syntax error at column 37"),
    ("BATCH_SIZE = 8 8", "syntax error at column 16: expected a newline"),
    ("train.log_every = (5", "'(' at column 19 is never closed"),
]


@pytest.mark.parametrize("binding,where", BAD_SYNTAX)
def test_a_gin_syntax_error_names_the_binding_and_the_position(binding, where):
    import gin

    try:
        with pytest.raises(GinConfigError) as raised:
            parse_gin(["tiny_local.gin"], [binding])
    finally:
        gin.clear_config()
    message = str(raised.value)
    assert message == f"gin binding {binding!r}: {where}" or message.startswith(
        f"gin binding {binding!r}: {where}"
    ), message
    assert "\n" not in message


def test_a_gin_file_syntax_error_names_the_file_line_and_column(tmp_path):
    import gin

    bad = tmp_path / "mine.gin"
    bad.write_text("include 'runs/tiny_local.gin'\n\nBATCH_SIZE = (8\n")
    including = tmp_path / "outer.gin"
    including.write_text(f"include '{bad}'\n")
    try:
        with pytest.raises(GinConfigError) as raised:
            parse_gin([str(bad)])
        assert str(raised.value) == f"bad gin file {bad}: '(' at line 3, column 14 is never closed"
        bad.write_text("include 'runs/tiny_local.gin'\nTRAIN_STEPS = [1,, 2]\n")
        with pytest.raises(GinConfigError) as raised:  # reported in the file that has it
            parse_gin([str(including)])
        assert str(raised.value) == (
            f"bad gin file {bad}: syntax error at line 2, column 18: unable to parse value"
        )
    finally:
        gin.clear_config()


def _mains():
    from keras_moe.distill import distill_cli
    from keras_moe.tpu_compile import compile_cli
    from keras_moe.training import eval_cli, train_cli

    return {
        "keras-moe-train": train_cli.main,
        "keras-moe-eval": eval_cli.main,
        "python -m keras_moe.distill": distill_cli.main,
        "keras-moe-compile": compile_cli.main,
    }


@pytest.mark.e2e
@pytest.mark.parametrize("command", sorted(_mains()))
def test_every_command_refuses_a_gin_syntax_error_in_one_line(command, tmp_path):
    from tests.training.helpers import run_cli_here

    binding, where = BAD_SYNTAX[0]
    model_dir = tmp_path / "run"
    args = ["--gin_file=tiny_local.gin", f"--gin_bindings={binding}"]
    if command == "keras-moe-eval":  # evaluates a run that exists
        model_dir.mkdir()
    if command != "keras-moe-compile":
        args.append(f"--model_dir={model_dir}")
    result = run_cli_here(args, main=_mains()[command])
    assert result.returncode == 2, result.stderr[-3000:]
    lines = result.stderr.strip().splitlines()
    assert lines == [f"{command}: error: gin binding {binding!r}: {where}"], result.stderr[-3000:]
    assert not model_dir.exists() or not list(model_dir.iterdir())
