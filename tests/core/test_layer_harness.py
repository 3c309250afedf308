"""Every registered keras_moe layer through the layer harness, on TensorFlow and on JAX."""

import os
import subprocess
import sys

import pytest

from tests.core.helpers import JAX_NUMERICS_ENV
from tests.core.layer_harness import CASES, case_classes, check_layer, registered_layers

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

JAX_SCRIPT = """
import os, sys
os.environ["KERAS_BACKEND"] = "jax"
sys.path.insert(0, {root!r})
from tests.core.layer_harness import CASES, check_layer
for name, case in sorted(CASES.items()):
    if "jax" in case.backends:
        check_layer(name, case)
        print("OK", name, flush=True)
"""


def test_every_registered_layer_has_a_case():
    assert registered_layers() == case_classes()


@pytest.mark.parametrize("name", sorted(CASES))
def test_layer_on_tensorflow(name):
    check_layer(name, CASES[name])


@pytest.mark.slow
@pytest.mark.jax
@pytest.mark.jax_harness
def test_layers_on_jax():
    env = dict(
        os.environ,
        KERAS_BACKEND="jax",
        JAX_PLATFORMS="cpu",
        TF_CPP_MIN_LOG_LEVEL="3",
        **JAX_NUMERICS_ENV,
    )
    result = subprocess.run(
        [sys.executable, "-c", JAX_SCRIPT.format(root=ROOT)],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    expected = sorted(name for name, case in CASES.items() if "jax" in case.backends)
    assert [
        line.split()[1] for line in result.stdout.splitlines() if line.startswith("OK ")
    ] == expected
