"""Importing keras_moe leaves the process alone: no stderr redirection, no gin for the models."""

import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

PROBE = """
import os, sys
redirected = []
real_dup2 = os.dup2
def dup2(fd, fd2, *args):
    redirected.append(fd2)
    return real_dup2(fd, fd2, *args)
os.dup2 = dup2
import keras_moe
print("keras after import keras_moe:", "keras" in sys.modules)
from keras_moe.models import T5Config, build_model
from keras_moe import SwitchFeedForward
import functools
build_model(T5Config(vocab_size=32, d_model=16, num_heads=2, d_ff=32, num_encoder_layers=1,
                     num_decoder_layers=1, sparse_ffn=functools.partial(
                         SwitchFeedForward, num_experts=2, d_ff=16)))
print("gin:", "gin" in sys.modules)
print("descriptors redirected:", redirected)
"""


def test_import_and_build_a_model_without_touching_stderr_or_gin():
    env = {**os.environ, "PYTHONPATH": REPO, "KERAS_BACKEND": "tensorflow",
           "TF_CPP_MIN_LOG_LEVEL": "3"}
    result = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True,
                            env=env, timeout=180, cwd=REPO)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.splitlines() == ["keras after import keras_moe: False", "gin: False",
                                          "descriptors redirected: []"]


def test_lazy_exports_are_the_modules_objects_and_unknown_names_fail():
    import keras_moe
    from keras_moe import feedforward, routing

    assert keras_moe.SwitchFeedForward is feedforward.SwitchFeedForward
    assert keras_moe.TopKRouter is routing.TopKRouter
    assert "GShardFeedForward" in dir(keras_moe)
    try:
        keras_moe.NoSuchLayer
    except AttributeError as e:
        assert "NoSuchLayer" in str(e)
    else:
        raise AssertionError("an unknown name resolved")
