"""TopKFeedForward against HF's Qwen2-MoE and OLMoE blocks on the JAX backend, in a fresh process.

Run by tests/core/test_hf_moe_blocks.py; prints one "OK <check>" line per check.
"""

import os
import sys

os.environ["KERAS_BACKEND"] = "jax"
os.environ.setdefault("JAX_PLATFORMS", "cpu")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import keras
import numpy as np

from tests.core import hf_moe_reference as reference

assert keras.backend.backend() == "jax"
TOL = 1e-5
rng = np.random.default_rng(0)


def _check(hf, layer):
    x = rng.normal(size=(3, 10, reference.D)).astype("float32")
    want, want_logits = reference.hf_outputs(hf, x)
    got, stats = layer(x, training=False, return_metrics=True)
    assert float(stats["dropped_fraction"]) == 0.0
    np.testing.assert_allclose(np.asarray(got), want, rtol=TOL, atol=TOL)
    np.testing.assert_allclose(np.asarray(layer.router(x)), want_logits, rtol=TOL, atol=TOL)


def check_qwen2_moe():
    for norm_topk_prob in (False, True):
        for dispatch in ("dropless", "gather"):
            _check(*reference.qwen2_moe_pair(np.random.default_rng(7), norm_topk_prob, dispatch))
    print("OK qwen2_moe")


def check_olmoe():
    for dispatch in ("dropless", "gather"):
        _check(*reference.olmoe_pair(np.random.default_rng(7), dispatch))
    print("OK olmoe")


if __name__ == "__main__":
    check_qwen2_moe()
    check_olmoe()
