"""Each benchmark script runs at a tiny size and writes valid JSON (no timings are asserted)."""

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _run(script, output, *extra):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", JAX_PLATFORMS="cpu")
    cmd = [sys.executable, os.path.join(ROOT, "benchmarks", script), "--smoke",
           "--output", output, *extra]
    result = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
    path = os.path.join(ROOT, "benchmarks", "results", f"{output}.json")
    try:
        with open(path) as f:
            return json.load(f)
    finally:
        os.remove(path)


def test_layer_speed_smoke():
    data = _run("layer_speed.py", "smoke_layer_speed")
    assert data["benchmark"] == "layer_speed"
    names = {(r["layer"], r["dispatch"], r["num_experts"]) for r in data["rows"]}
    assert names == {(layer, d, e) for layer in ("switch", "gshard")
                     for d in ("gather", "einsum") for e in (2, 4)}
    for row in data["rows"]:
        assert row["t_moe_s"] > 0 and row["t_dense_s"] > 0
        assert row["ratio_vs_cf_dense"] == pytest.approx(
            row["t_moe_s"] / ((1 if row["layer"] == "switch" else 2) * 1.25 * row["t_dense_s"]))


def test_memory_smoke():
    data = _run("memory.py", "smoke_memory")
    kinds = {r["kind"] for r in data["rows"]}
    assert kinds == {"dense", "gather", "einsum"}
    for row in data["rows"]:
        assert row["peak_rss_growth_mb"] >= 0
        assert row["activations_mb"] == pytest.approx(
            row["peak_rss_growth_mb"] - row["weight_gradients_mb"])


def test_peers_smoke():
    data = _run("peers.py", "smoke_peers")
    row = data["rows"][0]
    assert set(row["median_s"]) == {"keras_moe_switch_gather", "keras_moe_switch_einsum",
                                     "hf_switch_torch", "keras_moe_expert_choice_gather"}
    assert row["speedup_switch_vs_hf"] == pytest.approx(
        row["median_s"]["hf_switch_torch"] / row["median_s"]["keras_moe_switch_gather"])
