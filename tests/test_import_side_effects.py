"""Importing keras_moe leaves the process alone (no stderr redirection, no gin for the
models), and still registers its layers for loading saved models."""

import os
import subprocess
import sys

import pytest

# Each test here starts a process.
pytestmark = pytest.mark.e2e

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

PROBE = """
import os, sys
redirected = []
real_dup2 = os.dup2
def dup2(fd, fd2, *args):
    redirected.append(fd2)
    return real_dup2(fd, fd2, *args)
os.dup2 = dup2
import functools
import keras_moe
from keras_moe import SwitchFeedForward
from keras_moe.models import T5Config, build_model
build_model(T5Config(vocab_size=32, d_model=16, num_heads=2, d_ff=32, num_encoder_layers=1,
                     num_decoder_layers=1, sparse_ffn=functools.partial(
                         SwitchFeedForward, num_experts=2, d_ff=16)))
print("gin:", "gin" in sys.modules)
print("descriptors redirected:", redirected)
"""

SAVE = """
import keras, numpy as np, sys
from keras_moe import SwitchFeedForward
x = keras.Input((4, 8))
model = keras.Model(x, SwitchFeedForward(2, 8, track_metrics=False)(x))
model.save(sys.argv[1])
np.save(sys.argv[1] + ".npy", keras.ops.convert_to_numpy(model(np.ones((1, 4, 8), "float32"))))
"""

LOAD = """
import keras, numpy as np, sys
import keras_moe  # registers the layers
model = keras.saving.load_model(sys.argv[1], safe_mode=True)
np.testing.assert_allclose(keras.ops.convert_to_numpy(model(np.ones((1, 4, 8), "float32"))),
                           np.load(sys.argv[1] + ".npy"), rtol=1e-6)
print(type(model.layers[1]).__name__)
"""


def _python(code, *args):
    env = {
        **os.environ,
        "PYTHONPATH": REPO,
        "KERAS_BACKEND": "tensorflow",
        "TF_CPP_MIN_LOG_LEVEL": "3",
    }
    result = subprocess.run(
        [sys.executable, "-c", code, *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=180,
        cwd=REPO,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout.splitlines()


def test_import_and_build_a_model_without_touching_stderr_or_gin():
    assert _python(PROBE) == ["gin: False", "descriptors redirected: []"]


def test_a_fresh_process_that_imports_keras_moe_loads_a_saved_layer(tmp_path):
    path = str(tmp_path / "switch.keras")
    _python(SAVE, path)
    assert _python(LOAD, path) == ["SwitchFeedForward"]
