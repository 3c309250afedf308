"""`keras_moe.parse_gin` as the README's notebook quick start writes it: a file name, or a list."""

import os
import pathlib
import re

import pytest

import gin
import keras_moe
from keras_moe import models
from keras_moe.gin_config import resolve

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(autouse=True)
def _clean_gin():
    gin.clear_config()
    yield
    gin.clear_config()


def _readme_parse_gin_call():
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        calls = re.findall(r"keras_moe\.parse_gin\([^)]*\)", f.read())
    assert calls, "the README no longer shows keras_moe.parse_gin"
    return calls[0]


def test_the_readme_call_works_as_written():
    call = _readme_parse_gin_call()
    assert call == 'keras_moe.parse_gin("switch_tiny.gin")'
    config = eval(call, {"keras_moe": keras_moe})  # the README's own text
    # It stands in for `config = models.T5Config(...)`: switch_tiny.gin's model.
    assert isinstance(config, models.T5Config)
    assert (config.sparse_ffn["class_name"], config.num_experts, config.d_model) == (
        "keras_moe>SwitchFeedForward",
        8,
        64,
    )
    assert config.resolved_encoder_sparse_layers() == (1,)


def test_one_name_a_path_or_a_list_give_the_same_config(tmp_path):
    by_name = keras_moe.parse_gin("switch_tiny")
    gin.clear_config()
    by_list = keras_moe.parse_gin(["switch_tiny.gin"], ["SwitchFeedForward.num_experts = 4"])
    gin.clear_config()
    path = pathlib.Path(resolve("switch_tiny"))
    # os.PathLike, one binding as a str
    by_path = keras_moe.parse_gin(path, "SwitchFeedForward.num_experts = 4")
    assert by_name.num_experts == 8
    assert by_list == by_path and by_list.num_experts == 4
    spec = by_list.sparse_ffn
    assert (
        by_list.replace(sparse_ffn=dict(spec, config=dict(spec["config"], num_experts=8)))
        == by_name
    )


def test_a_file_of_ones_own_and_an_unknown_name(tmp_path, monkeypatch):
    own = tmp_path / "my_model.gin"
    own.write_text("include 'models/switch_tiny.gin'\nSwitchFeedForward.num_experts = 2\n")
    assert keras_moe.parse_gin(str(own)).num_experts == 2
    gin.clear_config()
    monkeypatch.chdir(tmp_path)
    assert keras_moe.parse_gin("my_model.gin").num_experts == 2  # in the current folder
    with pytest.raises(ValueError, match="no_such_model"):
        keras_moe.parse_gin("no_such_model.gin")


def test_files_that_bind_no_model_config_return_none(tmp_path):
    own = tmp_path / "macros.gin"
    own.write_text("NUM_EXPERTS = 2\n")
    assert keras_moe.parse_gin(own) is None


def test_a_second_call_does_not_inherit_the_first_ones_bindings():
    four = keras_moe.parse_gin("switch_tiny.gin", "SwitchFeedForward.num_experts = 4")
    assert four.num_experts == 4
    dense = keras_moe.parse_gin("tiny.gin")
    assert (dense.sparse_ffn, dense.num_experts) == (None, 0)
    # clear=False adds to the config instead.
    keras_moe.parse_gin("switch_tiny.gin")
    assert keras_moe.parse_gin("tiny.gin", clear=False).num_experts == 8
