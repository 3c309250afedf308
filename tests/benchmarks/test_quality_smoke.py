"""benchmarks/quality.py and benchmarks/translation.py run at a tiny size and write valid JSON."""

import os
import sys
import tempfile

import pytest

from tests.benchmarks.smoke import ROOT, run_smoke

sys.path.insert(0, ROOT)


def _run(script, output, *extra):
    found = run_smoke(script, output, *extra, extensions=("json", "png"))
    return found["json"], "png" in found


def test_steps_to_reach_interpolates():
    from benchmarks.quality_stats import steps_to_reach

    curve = [(0, -9.0), (100, -5.0), (200, -3.0)]
    assert steps_to_reach(curve, -4.0) == pytest.approx(150.0)
    assert steps_to_reach(curve, -5.0) == pytest.approx(100.0)
    assert steps_to_reach(curve, -10.0) == 0.0
    assert steps_to_reach(curve, -2.0) is None


def test_compare_reads_steps_and_wall_time_off_the_curves():
    from benchmarks.quality_stats import compare, difference_with_noise

    dense = {
        "curve": [
            {"step": 0, "seconds": 0.0, "neg_log_perplexity": -9.0},
            {"step": 100, "seconds": 50.0, "neg_log_perplexity": -5.0},
            {"step": 200, "seconds": 100.0, "neg_log_perplexity": -4.0},
        ],
        "final_neg_log_perplexity": -4.0,
        "final_std": 0.02,
        "step_time_s": 0.5,
        "final_per_seed": [-4.02, -3.98],
    }
    # Reaches -4.0 a quarter of the way from step 50 (-4.2) to step 100 (-3.4): step 62.5,
    # at 37.5 s (0.6 s/step), against the dense model's 200 steps and 100 s.
    moe = {
        "curve": [
            {"step": 0, "seconds": 0.0, "neg_log_perplexity": -9.0},
            {"step": 50, "seconds": 30.0, "neg_log_perplexity": -4.2},
            {"step": 100, "seconds": 60.0, "neg_log_perplexity": -3.4},
            {"step": 200, "seconds": 120.0, "neg_log_perplexity": -3.9},
        ],
        "final_neg_log_perplexity": -3.9,
        "final_std": 0.04,
        "step_time_s": 0.6,
        "final_per_seed": [-3.86, -3.94],
    }
    c = compare(moe, dense)
    assert c["steps_to_dense_final"] == pytest.approx(62.5)
    assert c["fraction_of_dense_steps"] == pytest.approx(0.3125)
    assert c["seconds_to_dense_final"] == pytest.approx(37.5)
    assert c["fraction_of_dense_seconds"] == pytest.approx(0.375)
    assert c["final_gain_over_dense"] == pytest.approx(0.1)
    assert c["gain_in_dense_seed_std"] == pytest.approx(5.0)
    assert c["meets"] == {"gain": True, "half_steps": True, "half_wall_clock": True}
    slow = dict(
        moe, step_time_s=2.0, curve=[dict(p, seconds=4 * p["seconds"]) for p in moe["curve"]]
    )
    assert compare(slow, dense)["meets"]["half_wall_clock"] is False
    # With an interleaved step-time ratio the time is steps-to-reach x that ratio.
    timed = compare(slow, dense, step_time_ratio=1.2)
    assert timed["fraction_of_dense_time"] == pytest.approx(0.3125 * 1.2)
    assert timed["meets"]["half_wall_clock"] is True
    assert compare(moe, dense, step_time_ratio=1.7)["meets"]["half_wall_clock"] is False
    assert compare(dense, moe)["meets"]["gain"] is False
    # Difference of two 2-seed means: noise std sqrt((0.04^2 + 0.02^2) / 2) = 0.0316.
    d = difference_with_noise(moe, dense)
    assert d["noise_std"] == pytest.approx(0.031623, abs=1e-6) and d["resolved"] is True


def test_help_describes_quality_py_with_its_docstring_first_line():
    from benchmarks import quality, quality_args

    assert quality_args.DESCRIPTION == quality.__doc__.splitlines()[0]


def test_cosine_schedule_warms_up_to_the_peak_and_ends_at_a_tenth():
    from benchmarks.quality_args import parse_args
    from benchmarks.quality_training import learning_rate

    schedule = learning_rate(
        parse_args(
            [
                "--steps",
                "100",
                "--eval_every",
                "10",
                "--learning_rate",
                "0.002",
                "--schedule",
                "cosine",
            ]
        )
    )
    assert float(schedule(0)) == pytest.approx(0.0)
    assert float(schedule(5)) == pytest.approx(0.001)
    assert float(schedule(10)) == pytest.approx(0.002)
    assert float(schedule(100)) == pytest.approx(0.0002)
    assert learning_rate(parse_args(["--learning_rate", "0.002"])) == 0.002
    with pytest.raises(SystemExit):
        parse_args(["--steps", "10", "--eval_every", "10", "--warmup_steps", "10"])


def test_mean_over_seeds_averages_curves_and_reports_the_spread():
    from benchmarks.quality_stats import mean_over_seeds

    def record(values, step_time):
        return {
            "curve": [
                {
                    "step": s,
                    "seconds": 2.0 * s,
                    "neg_log_perplexity": v,
                    "accuracy": 0.5,
                    "loss": -v,
                }
                for s, v in zip((0, 10), values, strict=False)
            ],
            "final_neg_log_perplexity": values[-1],
            "step_time_s": step_time,
            "train_seconds": 20.0,
        }

    run = mean_over_seeds(
        [record([-9.0, -4.0], 0.1), record([-9.0, -4.3], 0.3), record([-9.0, -4.2], 0.2)], [0, 1, 2]
    )
    assert [p["neg_log_perplexity"] for p in run["curve"]] == pytest.approx([-9.0, -12.5 / 3])
    assert run["curve"][1]["seconds"] == 20.0
    assert run["final_neg_log_perplexity"] == pytest.approx(-4.166667, abs=1e-6)
    assert run["final_per_seed"] == [-4.0, -4.3, -4.2]
    # Sample std of (-4.0, -4.3, -4.2): sqrt((0.1667^2 + 0.1333^2 + 0.0333^2) / 2) = 0.1528.
    assert run["final_std"] == pytest.approx(0.152753, abs=1e-6)
    assert run["step_time_s"] == 0.2 and run["train_seconds"] == 60.0
    assert run["seeds"] == [0, 1, 2] and len(run["per_seed"]) == 3
    assert mean_over_seeds([record([-9.0, -4.0], 0.1)], [0])["final_std"] is None


@pytest.mark.slow
def test_quality_smoke():
    data, has_plot = _run("quality.py", "smoke_quality", "--seeds", "1", "--timing_repeats", "0")
    assert data["benchmark"] == "quality" and data["seeds"] == [0]
    assert has_plot and data["plot"].endswith("smoke_quality.png")
    assert set(data["runs"]) == {"dense", "switch2"}
    for run in data["runs"].values():
        assert [p["step"] for p in run["curve"]] == [0, 2, 4]
        assert all(p["neg_log_perplexity"] < 0 for p in run["curve"])
        assert run["final_neg_log_perplexity"] == run["curve"][-1]["neg_log_perplexity"]
        assert run["step_time_s"] > 0
        seconds = [p["seconds"] for p in run["curve"]]
        assert seconds[0] == 0.0 and seconds[1] < seconds[2]
        assert run["final_per_seed"] == [run["final_neg_log_perplexity"]]
    assert data["runs"]["switch2"]["params"] > data["runs"]["dense"]["params"]
    assert data["held_out_target_tokens"] > 0 and data["complete"] is True
    assert data["interleaved_step_times"] is None  # --timing_repeats 0; see the --retime test
    # Router health of every MoE layer is recorded, training and held-out.
    router = data["runs"]["switch2"]["per_seed"][0]["router"]
    dropped = [k for k in router if k.endswith("/dropped_fraction")]
    assert dropped and any(k.startswith("val_") for k in dropped)
    assert all(0.0 <= router[k] <= 1.0 for k in dropped)
    assert data["runs"]["dense"]["per_seed"][0]["router"] == {}
    c = data["comparison"]["switch2"]
    assert set(c) >= {
        "steps_to_dense_final",
        "fraction_of_dense_steps",
        "fraction_of_dense_seconds",
        "meets",
        "final_gain_over_dense",
    }
    assert data["ordering_by_experts"][0]["difference"] == pytest.approx(c["final_gain_over_dense"])
    assert c["final_gain_over_dense"] == pytest.approx(
        data["runs"]["switch2"]["final_neg_log_perplexity"] - data["dense_final_neg_log_perplexity"]
    )
    assert data["table1"] == []

    # The same training from saved batches (no seqio: what a JAX GPU host runs), in two
    # worker processes, lands on the same values. (The export only writes batches: its
    # main() runs here rather than in a process of its own.)
    from benchmarks import quality

    with tempfile.TemporaryDirectory() as batches:
        quality.main(["--smoke", "--seeds", "1", "--export_batches", batches])
        assert sorted(os.listdir(batches)) == ["held_out.npz", "meta.json", "train_seed0.npz"]
        from_files = run_smoke(
            "quality.py",
            "smoke_quality_files",
            "--seeds",
            "1",
            "--timing_repeats",
            "0",
            "--no_plot",
            "--batches",
            batches,
            "--workers",
            "2",
        )["json"]
    assert from_files["held_out_target_tokens"] == data["held_out_target_tokens"]
    for name, run in data["runs"].items():
        assert from_files["runs"][name]["final_per_seed"] == pytest.approx(
            run["final_per_seed"], rel=1e-5
        )


@pytest.mark.slow
def test_translation_bleu_and_smoke():
    from benchmarks.translation import corpus_bleu, language_of, strip_ids

    refs = [
        "In the beginning God created the heavens and the earth.",
        "The earth was formless and empty.",
    ]
    assert corpus_bleu(refs, refs) == pytest.approx(100.0)
    assert corpus_bleu(refs, ["x y z", "q r s t"]) < 1.0
    assert language_of("bible_fr_en") == "fr" and language_of("embedded_es_en_byte") == "es"
    assert strip_ids([5, 0, 7, 1, 9, 0]) == [5, 7]

    data, _ = _run("translation.py", "smoke_translation")
    assert data["benchmark"] == "translation" and data["task"] == "embedded_x2en"
    assert set(data["runs"]) == {"dense", "switch2"}
    langs = {"es", "fr", "it"}
    for run in data["runs"].values():
        assert set(run["bleu"]) == langs
        assert all(0.0 <= v <= 100.0 for v in run["bleu"].values())
        assert [p["step"] for p in run["curve"]] == [0, 2, 4]
        assert run["seeds"] == [0] and len(run["per_seed"]) == 1
        for lang in langs:
            sample = run["per_seed"][0]["samples"][lang][0]
            assert sample["reference"] and isinstance(sample["prediction"], str)
    assert {r["language"] for r in data["per_language"]} == langs
    assert data["target"]["languages"] == 3 and 0 <= data["target"]["moe_ahead"] <= 3
    assert data["bleu_self_check"] == 100.0


@pytest.mark.slow
def test_retime_adds_interleaved_step_times_to_an_existing_result(monkeypatch):
    import json
    import os

    from benchmarks import common, quality

    monkeypatch.setattr(common, "RESULTS_DIR", common.SMOKE_DIR)  # where --smoke writes

    curve = [
        {"step": 0, "seconds": 0.0, "neg_log_perplexity": -9.0},
        {"step": 4, "seconds": 999.0, "neg_log_perplexity": -8.0},
    ]
    run = {
        "curve": curve,
        "final_neg_log_perplexity": -8.0,
        "final_std": None,
        "step_time_s": 1.0,
        "final_per_seed": [-8.0],
    }
    moe = dict(
        run,
        curve=[
            curve[0],
            {"step": 2, "seconds": 1.0, "neg_log_perplexity": -8.0},
            dict(curve[1], neg_log_perplexity=-7.0),
        ],
        final_neg_log_perplexity=-7.0,
    )
    output = "smoke_retime"
    common.write_result(
        output, {"runs": {"dense": run, "switch2": moe}, "comparison": {}, "table1": []}
    )
    try:
        payload = quality.main(["--smoke", "--retime", "--output", output])
        with open(os.path.join(common.RESULTS_DIR, f"{output}.json")) as f:
            written = json.load(f)
    finally:
        os.remove(os.path.join(common.RESULTS_DIR, f"{output}.json"))
    times = written["interleaved_step_times"]
    assert set(times) == {"dense", "switch2"} and all(t["median"] > 0 for t in times.values())
    ratio = times["switch2"]["median"] / times["dense"]["median"]
    c = written["comparison"]["switch2"]
    # Reaches dense's final value at step 2 of 4: half the steps, times the step-time ratio.
    assert c["fraction_of_dense_time"] == pytest.approx(0.5 * ratio)
    assert c["step_time_vs_dense_interleaved"] == pytest.approx(ratio)
    assert payload["comparison"] == written["comparison"]


@pytest.mark.slow
def test_reuse_trains_only_the_models_a_result_lacks(monkeypatch):
    import json
    import os

    from benchmarks import common, quality, quality_args

    monkeypatch.setattr(common, "RESULTS_DIR", common.SMOKE_DIR)  # where --smoke writes
    output = "smoke_reuse"
    base = ["--smoke", "--seeds", "1", "--timing_repeats", "0", "--no_plot", "--output", output]
    stored_args = vars(quality_args.parse_args(base + ["--experts", "2"]))
    curve = [
        {"step": 0, "seconds": 0.0, "neg_log_perplexity": -9.0, "accuracy": 0.0, "loss": 9.0},
        {"step": 4, "seconds": 1.0, "neg_log_perplexity": -8.0, "accuracy": 0.1, "loss": 8.0},
    ]
    fake = {
        "curve": curve,
        "final_neg_log_perplexity": -8.0,
        "final_std": None,
        "step_time_s": 1.0,
        "final_per_seed": [-8.0],
    }
    trained = []

    def train_with_curve(
        model, train_ds, held_out, steps, eval_every, name="", eval_batch_size=None
    ):
        trained.append(name)
        return {
            "curve": [dict(p, neg_log_perplexity=-7.0) for p in curve],
            "final_neg_log_perplexity": -7.0,
            "step_time_s": 1.0,
            "train_seconds": 4.0,
        }

    monkeypatch.setattr(quality, "train_with_curve", train_with_curve)
    path = os.path.join(common.RESULTS_DIR, f"{output}.json")
    common.write_result(output, {"args": stored_args, "runs": {"dense": fake, "switch2": fake}})
    try:
        with pytest.raises(SystemExit, match="--steps 4 there, 6 now"):
            quality.main(base + ["--reuse", "--experts", "2", "3", "--steps", "6"])
        quality.main(base + ["--reuse", "--experts", "2", "3"])
        with open(path) as f:
            written = json.load(f)
    finally:
        os.remove(path)
    assert trained == ["switch3"]
    assert written["runs"]["dense"] == fake and written["runs"]["switch2"] == fake
    assert written["runs"]["switch3"]["final_neg_log_perplexity"] == -7.0
    assert written["comparison"]["switch3"]["final_gain_over_dense"] == pytest.approx(1.0)
    assert written["args"]["experts"] == [2, 3] and written["complete"] is True
    assert written["reused_runs"] == ["dense", "switch2"]


def test_distill_summary_fractions_by_hand():
    """Two seeds; gains and fractions worked out by hand."""
    from benchmarks.distill import summarise

    finals = {
        "dense_baseline": [-4.40, -4.42],
        "dense_baseline_more_steps": [-4.30, -4.34],
        "switch_teacher": [-4.34, -4.34],
        "distilled_student": [-4.37, -4.39],
    }
    s = summarise(finals)
    assert s["dense_baseline"]["mean"] == pytest.approx(-4.41)
    assert s["dense_baseline"]["std"] == pytest.approx(0.02 / 2**0.5)
    base = s["vs_dense_baseline"]
    # teacher gains 0.06 and 0.08 (mean 0.07); student gains 0.03 and 0.03.
    assert base["teacher_gain"] == pytest.approx(0.07)
    assert base["teacher_gain_std_of_mean"] == pytest.approx(0.01)
    assert base["student_gain"] == pytest.approx(0.03)
    assert base["fraction_kept"] == pytest.approx(0.03 / 0.07)
    assert base["fraction_kept_per_seed"] == pytest.approx([0.5, 0.375])
    more = s["vs_dense_baseline_more_steps"]
    # The teacher does not beat the longer-trained baseline in seed 0 (-4.34 < -4.30):
    # no fraction there, nor of the means (-4.34 < -4.32).
    assert more["fraction_kept_per_seed"][0] is None and more["fraction_kept"] is None
    assert more["fraction_kept_per_seed"][1] is None  # equal: no gain to keep
