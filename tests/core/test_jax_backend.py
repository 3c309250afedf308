"""The core layers on the JAX backend (a separate process: the backend is fixed per process)."""

import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.slow
@pytest.mark.jax
def test_core_layers_on_jax_backend():
    env = dict(os.environ, KERAS_BACKEND="jax", JAX_PLATFORMS="cpu", TF_CPP_MIN_LOG_LEVEL="3")
    script = os.path.join(ROOT, "tests", "core", "jax_backend_checks.py")
    result = subprocess.run([sys.executable, script], env=env, cwd=ROOT, capture_output=True,
                            text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    for check in ("reference", "gradients", "dropless", "empty_batch", "fit_save_bf16",
                  "router_metrics", "compiled_decoding"):
        assert f"OK {check}" in result.stdout
