"""Each benchmark script runs at a tiny size and writes the JSON its docs describe.

No timing is asserted (the machine decides those). What is asserted can fail:
the rows and fields each script promises, sizes computed here by hand from the
`--smoke` sizes, the arithmetic of the reports on timings we choose (a fake
clock, a fake TF Model Garden server), and ranges with a stated reason.
"""

import json
import math
import os
import stat
import sys

import pytest

from tests.benchmarks.smoke import run_smoke

# The sizes each script's --smoke flag sets (see their main()).
SMOKE_TOKENS, SMOKE_SEQ_LEN, SMOKE_D_MODEL, SMOKE_D_FF = 256, 64, 16, 32


def _run(script, output, *extra):
    return run_smoke(script, output, *extra)["json"]


def _positive_seconds(value):
    return isinstance(value, float) and math.isfinite(value) and 0 < value < 600


def test_layer_speed_reports_on_a_fake_clock(monkeypatch):
    """The ratios for timings we choose, worked out by hand (k = 1 switch, 2 gshard; cf 1.25)."""
    from benchmarks import common, layer_speed

    medians = {
        "dense": 1.0,
        "switch/gather/E2": 2.5,
        "switch/gather/E4": 3.0,
        "gshard/gather/E2": 5.0,
        "gshard/gather/E4": 6.25,
    }
    seen = []

    def fake_medians(functions, repeats, warmup=2):
        seen.append(sorted(functions))
        return {
            name: {"median": medians[name], "spread": 0.0, "samples": [medians[name]]}
            for name in functions
        }

    monkeypatch.setattr(common, "interleaved_medians", fake_medians)
    rows = layer_speed.run(
        [128],
        [2, 4],
        d_model=8,
        d_ff=16,
        capacity_factor=1.25,
        layers=["switch", "gshard"],
        dispatches=["gather"],
        repeats=1,
        seq_len=64,
    )
    assert seen == [sorted(medians)]  # dense and every layer timed together, once
    got = {
        (r["layer"], r["num_experts"]): (r["ratio_vs_cf_dense"], r["ratio_vs_first_E"])
        for r in rows
    }
    assert got == pytest.approx(
        {
            ("switch", 2): (2.0, 1.0),
            ("switch", 4): (2.4, 1.2),
            ("gshard", 2): (2.0, 1.0),
            ("gshard", 4): (2.5, 1.25),
        }
    )
    assert {r["t_dense_s"] for r in rows} == {1.0} and {r["tokens"] for r in rows} == {128}


@pytest.mark.e2e
def test_layer_speed_smoke():
    """Run as the docstring shows, in a process of its own and without --output: the
    result goes to results/smoke/."""
    data = run_smoke("layer_speed.py", "layer_speed", default_output=True, own_process=True)["json"]
    assert data["benchmark"] == "layer_speed"
    assert (data["args"]["tokens"], data["args"]["experts"]) == ([SMOKE_TOKENS], [2, 4])
    assert data["environment"]["backend"] == "tensorflow"
    names = [(r["layer"], r["dispatch"], r["num_experts"]) for r in data["rows"]]
    assert sorted(names) == sorted(
        (layer, d, e)
        for layer in ("switch", "gshard")
        for d in ("gather", "einsum", "dropless")
        for e in (2, 4)
    )
    for row in data["rows"]:
        assert row["tokens"] == SMOKE_TOKENS
        assert _positive_seconds(row["t_moe_s"]) and _positive_seconds(row["t_dense_s"])
        if row["num_experts"] == 2:  # the first E is its own base
            assert row["ratio_vs_first_E"] == 1.0
    # One dense FFN, timed beside all the layers, is the base of every row.
    assert len({row["t_dense_s"] for row in data["rows"]}) == 1


@pytest.mark.slow
def test_memory_smoke():
    # Its own process: a child's peak RSS (ru_maxrss) starts at its parent's when it is
    # exec'd, so children of this large pytest process would all measure 0 growth.
    data = run_smoke("memory.py", "smoke_memory", own_process=True)["json"]
    rows = {r["kind"]: r for r in data["rows"]}
    assert sorted(r["kind"] for r in data["rows"]) == ["dense", "dropless", "einsum", "gather"]
    assert {r["tokens"] for r in data["rows"]} == {SMOKE_TOKENS}
    # Weight gradients by hand, float32: the dense FFN has wi [16, 32] and wo [32, 16]; the
    # Switch layer has 4 experts of those plus a [16, 4] router, whatever the dispatcher.
    dense_bytes = 2 * SMOKE_D_MODEL * SMOKE_D_FF * 4
    switch_bytes = 4 * dense_bytes + SMOKE_D_MODEL * 4 * 4
    assert rows["dense"]["weight_gradients_mb"] == pytest.approx(dense_bytes / 2**20)
    for kind in ("gather", "einsum", "dropless"):
        assert rows[kind]["weight_gradients_mb"] == pytest.approx(switch_bytes / 2**20)
    for row in rows.values():
        # Each child imported TensorFlow before its baseline: hundreds of MB, not KB
        # (ru_maxrss is in KB on Linux; a wrong unit would be off by 1024).
        assert 100 < row["baseline_mb"] < 20_000, row
        # The measured step moves a few KB of tensors: growth far beyond that means the
        # window caught something else (tracing, a second model).
        assert row["peak_rss_growth_mb"] < 200, row
    assert rows["dense"]["ratio_vs_dense"] == 1.0


FAKE_TFM_SERVER = """#!{python}
# Stands in for benchmarks/tfm_server.py (run as: <python> tfm_server.py): same protocol,
# a fixed step time, and a record of what it was asked.
import json, os, sys
config = json.loads(sys.stdin.readline())
steps = 0
print(json.dumps({{"ready": True, "tensorflow": "fake-2.20"}}), flush=True)
for line in sys.stdin:
    if line.strip() != "step":
        break
    steps += 1
    print(json.dumps({{"seconds": 0.25}}), flush=True)
with open(os.environ["FAKE_TFM_RECORD"], "w") as f:
    json.dump({{"config": config, "steps": steps}}, f)
"""


@pytest.fixture
def fake_tfm_python(tmp_path, monkeypatch):
    path = tmp_path / "python"
    path.write_text(FAKE_TFM_SERVER.format(python=sys.executable))
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    record = tmp_path / "record.json"
    monkeypatch.setenv("FAKE_TFM_RECORD", str(record))
    return str(path), record


@pytest.mark.slow
def test_peers_smoke_with_the_model_garden_peer(fake_tfm_python):
    python, record = fake_tfm_python
    data = _run("peers.py", "smoke_peers", "--tfm_python", python)
    row = data["rows"][0]
    assert set(row["median_s"]) == {
        "keras_moe_switch_gather",
        "keras_moe_switch_einsum",
        "keras_moe_switch_dropless",
        "hf_switch_torch",
        "keras_moe_expert_choice_gather",
        "dense_tf",
        "dense_torch",
        "tfm_expert_choice",
    }
    # The peer's own step time (0.25 s) is what is reported, not the round trip.
    assert row["median_s"]["tfm_expert_choice"] == 0.25 and row["tfm_tensorflow"] == "fake-2.20"
    assert row["speedup_expert_choice_vs_tfm"] == pytest.approx(
        0.25 / row["median_s"]["keras_moe_expert_choice_gather"]
    )
    asked = json.loads(record.read_text())
    assert asked == {
        "config": {
            "tokens": SMOKE_TOKENS,
            "seq_len": SMOKE_SEQ_LEN,
            "d_model": SMOKE_D_MODEL,
            "d_ff": SMOKE_D_FF,
            "num_experts": 4,
            "capacity_factor": 1.25,
        },
        "steps": data["args"]["repeats"],
    }
    assert row["capacity"] == 20  # ceil(1.25 * 64 tokens per sequence / 4 experts)
    assert all(_positive_seconds(t) for t in row["median_s"].values())
    assert row["speedup_dropless_vs_hf"] == pytest.approx(
        row["median_s"]["hf_switch_torch"] / row["median_s"]["keras_moe_switch_dropless"]
    )


@pytest.mark.slow
def test_peers_smoke_in_mixed_bfloat16_skips_the_float32_only_peer(fake_tfm_python):
    python, record = fake_tfm_python
    data = _run(
        "peers.py", "smoke_peers_bf16", "--precision", "mixed_bfloat16", "--tfm_python", python
    )
    assert data["args"]["precision"] == "mixed_bfloat16"
    assert data["args"]["tfm_python"] == python  # given, and still skipped:
    row = data["rows"][0]
    assert "tfm_expert_choice" not in row["median_s"]
    assert "speedup_expert_choice_vs_tfm" not in row
    assert not os.path.exists(record)  # the server was never started
    assert all(_positive_seconds(t) for t in row["median_s"].values())


@pytest.mark.slow
def test_model_speed_smoke():
    data = _run("model_speed.py", "smoke_model_speed")
    assert set(data["results"]) == {"keras_moe", "keras_moe_xla", "hf_switch_torch"}
    # --smoke: batch 2 of 16 input + 8 target tokens.
    assert data["tokens_per_step"] == 2 * (16 + 8)
    for r in data["results"].values():
        assert _positive_seconds(r["median_s"])
        assert r["tokens_per_s"] * r["median_s"] == pytest.approx(48)
    hf_s = data["results"]["hf_switch_torch"]["median_s"]
    # tokens/s ratios are the inverse ratios of step times.
    assert data["ratio_keras_moe_over_hf"] == pytest.approx(
        hf_s / data["results"]["keras_moe"]["median_s"]
    )
    assert data["ratio_keras_moe_xla_over_hf"] == pytest.approx(
        hf_s / data["results"]["keras_moe_xla"]["median_s"]
    )
    assert data["command"].endswith("--smoke --output smoke_model_speed")


@pytest.mark.slow
def test_decode_speed_smoke():
    data = _run("decode_speed.py", "smoke_decode_speed", "--eager")
    (case,) = data["cases"]  # --smoke: batch 2, 4 new tokens
    assert (case["batch_size"], case["new_tokens"]) == (2, 4)
    # Same weights, EOS disabled: the compiled search, HF and the SavedModel agree.
    assert case["greedy_tokens_equal_hf"] is True
    assert case["saved_model_greedy_tokens_equal"] is True
    assert set(case["results"]) == {
        f"{who}_{method}"
        for method in ("greedy", "beam")
        for who in ("hf", "keras_moe", "keras_moe_xla", "keras_moe_eager", "saved_model")
    }
    assert all(_positive_seconds(r["median_s"]) for r in case["results"].values())


@pytest.mark.e2e
def test_memory_plan_smoke():
    """Shapes only: splitting the experts over twice the devices halves their share.

    switch_tiny has 2 MoE layers of 8 experts, each expert a [64, 128] and a [128, 64]
    float32 kernel: 2 * 8 * 2 * 64 * 128 * 4 bytes = 1 MiB of expert weights. Going from
    2 to 4 devices on the "expert" axis, a device holds 1/4 instead of 1/2 of them.
    """
    data = _run("memory_plan.py", "smoke_memory_plan")
    rows = {r["devices"]: r for r in data["rows"]}
    assert sorted(rows) == [2, 4]
    assert rows[2]["mesh"] == {"data": 1, "expert": 2, "model": 1}
    assert rows[4]["mesh"] == {"data": 1, "expert": 4, "model": 1}
    expert_bytes = 2 * 8 * 2 * 64 * 128 * 4
    assert rows[2]["param_bytes"] - rows[4]["param_bytes"] == expert_bytes // 4
    for row in rows.values():
        assert row["parameters"] > 0 and row["temp_bytes"] > 0
        # One group per sequence: tokens reach the experts on other devices by all-to-all.
        assert row["all_to_all"] > 0, row


@pytest.mark.e2e
def test_layer_profile_runs_and_splits_its_stages_on_a_fake_clock(monkeypatch):
    """At the --smoke size every stage is built and compiled; on timings we choose each
    share is the difference of two stages, worked out by hand, and the dense base counts
    k / divisor dense FFNs (1 for Switch, 4 / 4 for the fine-grained shape)."""
    from benchmarks import common

    stage_times = {
        "router": 0.5,
        "dispatch": 0.75,
        "experts": 2.0,
        "layer": 3.0,
        "layer+metrics": 3.25,
    }
    ran = []

    def fake_medians(functions, repeats, warmup=2):
        for fn in functions.values():
            fn()  # every compiled stage runs once
        ran.extend(functions)
        times = {
            name: 2.0 if name == "dense" else stage_times[name.rsplit("/", 1)[1]]
            for name in functions
        }
        return {name: {"median": t, "spread": 0.0, "samples": [t]} for name, t in times.items()}

    monkeypatch.setattr(common, "interleaved_medians", fake_medians)
    data = _run("layer_profile.py", "smoke_layer_profile")
    assert len(ran) == 1 + 2 * 2 * 5  # dense, 2 shapes x 2 dispatchers x 5 stages
    assert data["benchmark"] == "layer_profile"
    assert [(r["shape"], r["dispatch"]) for r in data["rows"]] == [
        ("switch_e8", "dropless"),
        ("switch_e8", "gather"),
        ("fine_grained_e32_top4", "dropless"),
        ("fine_grained_e32_top4", "gather"),
    ]
    for row in data["rows"]:
        assert row["shares_s"] == pytest.approx(
            {
                "router": 0.5,
                "moving_tokens": 0.25,
                "expert_matmuls": 2.0,
                "fusion_rest": 0.25,
                "metrics": 0.25,
            }
        )
        assert row["layer_vs_dense_same_tokens"] == pytest.approx(1.5)
        cf = 1.0 if row["dispatch"] == "dropless" else 1.25
        assert row["experts_vs_cf_dense"] == pytest.approx(1.0 / cf)


@pytest.mark.e2e
def test_grouped_matmul_speed_smoke():
    data = _run("grouped_matmul_speed.py", "smoke_grouped_matmul_speed")
    assert data["benchmark"] == "grouped_matmul_speed"
    assert sorted((r["kernel"], r["num_experts"]) for r in data["rows"]) == [
        ("auto", 2),
        ("auto", 4),
    ]  # the TensorFlow backend has one kernel
    assert all(_positive_seconds(r["t_s"]) and r["t_dense_s"] > 0 for r in data["rows"])


def test_first_generate_times_a_real_worker_and_reports_over_hf():
    """The keras worker's four calls on the smoke model, in this process; the report's
    ratios for first calls we choose (HF's first 0.5 s: 2.0 s is 4x, 0.75 s is 1.5x)."""
    from benchmarks import first_generate

    args = first_generate.parse_args(["--smoke"])
    times = first_generate.keras_worker(args)
    assert sorted(times) == sorted(first_generate.TIMES)
    assert all(_positive_seconds(value) for value in times.values())

    def runs(*firsts):
        return [dict.fromkeys(first_generate.TIMES, 0.1) | {"first_s": f} for f in firsts]

    rows = first_generate.summarize(
        {"hf": runs(0.4, 0.5, 0.9), "tensorflow": runs(2.0, 3.0, 1.0), "jax_warm_cache": runs(0.75)}
    )
    assert rows["hf"]["first_s"]["median"] == 0.5 and rows["hf"]["first_s"]["spread"] == 0.25
    assert rows["tensorflow"]["first_over_hf_first"] == pytest.approx(4.0)
    assert rows["jax_warm_cache"]["first_over_hf_first"] == pytest.approx(1.5)
    with pytest.raises(SystemExit):
        first_generate.parse_args(["--new_length", "200"])  # not shorter than --inputs
