"""Each benchmark script runs at a tiny size and writes valid JSON (no timings are asserted)."""

import pytest

from tests.benchmarks.smoke import run_smoke


def _run(script, output, *extra):
    return run_smoke(script, output, *extra)["json"]


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
                                     "hf_switch_torch", "keras_moe_expert_choice_gather",
                                     "dense_tf", "dense_torch"}
    assert row["speedup_switch_vs_hf"] == pytest.approx(
        row["median_s"]["hf_switch_torch"] / row["median_s"]["keras_moe_switch_gather"])
    assert row["speedup_bound_vs_hf"] == pytest.approx(row["median_s"]["hf_switch_torch"] / min(
        row["median_s"]["dense_tf"], row["median_s"]["dense_torch"]))


def test_peers_smoke_in_mixed_bfloat16():
    data = _run("peers.py", "smoke_peers_bf16", "--precision", "mixed_bfloat16")
    assert data["args"]["precision"] == "mixed_bfloat16"
    row = data["rows"][0]
    assert "tfm_expert_choice" not in row["median_s"]
    assert row["speedup_switch_vs_hf"] > 0


def test_model_speed_smoke():
    data = _run("model_speed.py", "smoke_model_speed")
    assert set(data["results"]) == {"keras_moe", "keras_moe_xla", "hf_switch_torch"}
    tokens = data["tokens_per_step"]
    for r in data["results"].values():
        assert r["tokens_per_s"] == pytest.approx(tokens / r["median_s"])
    assert data["ratio_keras_moe_over_hf"] == pytest.approx(
        data["results"]["keras_moe"]["tokens_per_s"]
        / data["results"]["hf_switch_torch"]["tokens_per_s"])
    assert data["ratio_keras_moe_xla_over_hf"] == pytest.approx(
        data["results"]["keras_moe_xla"]["tokens_per_s"]
        / data["results"]["hf_switch_torch"]["tokens_per_s"])
