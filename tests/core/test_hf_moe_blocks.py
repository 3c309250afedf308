"""TopKFeedForward against HF transformers' Qwen2-MoE and OLMoE sparse blocks (torch, CPU).

Both sides get the same random float32 weights (`hf_moe_reference.py` copies
them) and the same input; the block outputs and the router logits must agree
to 1e-5. Each test also shows that a wrong copy (no shared expert, an ungated
one, the other top-k normalisation, the gated and linear halves swapped) is
far outside that tolerance, so the agreement is not an accident of small
outputs.
"""

import numpy as np
import pytest

from keras_moe.layers.dense_feedforward import DenseFeedForward
from tests.core import hf_moe_reference as reference
from tests.core.helpers import run_jax_checks

TOL = 1e-5
FAR = 1e-2  # a wrong copy must be off by at least this much somewhere (1000 x TOL)
SEED = 7
DISPATCHES = ["dropless", "gather"]  # "gather" with capacity for every token


def _keras_outputs(layer, x):
    got, stats = layer(x, training=False, return_metrics=True)
    assert float(stats["dropped_fraction"]) == 0.0
    return np.asarray(got)


def _assert_far(got, want):
    assert np.abs(got - want).max() > FAR


@pytest.mark.parametrize("dispatch", DISPATCHES)
@pytest.mark.parametrize("norm_topk_prob", [False, True])
def test_topk_feedforward_matches_hf_qwen2_moe_block(rng, norm_topk_prob, dispatch):
    hf, layer = reference.qwen2_moe_pair(np.random.default_rng(SEED), norm_topk_prob, dispatch)
    x = rng.normal(size=(3, 10, reference.D)).astype("float32")
    want, want_logits = reference.hf_outputs(hf, x)
    got = _keras_outputs(layer, x)
    np.testing.assert_allclose(got, want, rtol=TOL, atol=TOL)
    np.testing.assert_allclose(np.asarray(layer.router(x)), want_logits, rtol=TOL, atol=TOL)

    # The shared expert and its sigmoid gate both count.
    shared = layer.shared_experts
    routed = got - np.asarray(shared(x))
    _assert_far(routed, want)
    _assert_far(routed + np.asarray(DenseFeedForward.call(shared, x)), want)
    # So do the top-k normalisation and which half of gate_up_proj is gated.
    _, other = reference.qwen2_moe_pair(np.random.default_rng(SEED), not norm_topk_prob, dispatch)
    _assert_far(_keras_outputs(other, x), want)
    reference.copy_experts(hf.experts, layer, swap_gate_up=True)
    _assert_far(_keras_outputs(layer, x), want)


@pytest.mark.parametrize("dispatch", DISPATCHES)
def test_topk_feedforward_matches_hf_olmoe_block(rng, dispatch):
    hf, layer = reference.olmoe_pair(np.random.default_rng(SEED), dispatch)
    x = rng.normal(size=(3, 10, reference.D)).astype("float32")
    want, want_logits = reference.hf_outputs(hf, x)
    np.testing.assert_allclose(_keras_outputs(layer, x), want, rtol=TOL, atol=TOL)
    np.testing.assert_allclose(np.asarray(layer.router(x)), want_logits, rtol=TOL, atol=TOL)

    _, other = reference.olmoe_pair(np.random.default_rng(SEED), dispatch, norm_topk_prob=True)
    _assert_far(_keras_outputs(other, x), want)
    reference.copy_experts(hf.experts, layer, swap_gate_up=True)
    _assert_far(_keras_outputs(layer, x), want)


@pytest.mark.slow
@pytest.mark.jax
def test_hf_moe_blocks_on_jax():
    run_jax_checks("hf_moe_jax_checks.py", ("qwen2_moe", "olmoe"))
