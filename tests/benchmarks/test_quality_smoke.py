"""benchmarks/quality.py and benchmarks/translation.py run at a tiny size and write valid JSON."""

import sys

import pytest

from tests.benchmarks.smoke import ROOT, run_smoke

sys.path.insert(0, ROOT)


def _run(script, output, *extra):
    found = run_smoke(script, output, *extra, extensions=("json", "png"))
    return found["json"], "png" in found


def test_steps_to_reach_interpolates():
    from benchmarks.quality import steps_to_reach

    curve = [(0, -9.0), (100, -5.0), (200, -3.0)]
    assert steps_to_reach(curve, -4.0) == pytest.approx(150.0)
    assert steps_to_reach(curve, -5.0) == pytest.approx(100.0)
    assert steps_to_reach(curve, -10.0) == 0.0
    assert steps_to_reach(curve, -2.0) is None


def test_quality_smoke():
    data, has_plot = _run("quality.py", "smoke_quality", "--seeds", "2")
    assert data["benchmark"] == "quality" and data["seeds"] == [0, 1]
    assert has_plot and data["plot"].endswith("smoke_quality.png")
    assert set(data["runs"]) == {"dense", "switch2"}
    for run in data["runs"].values():
        assert [p["step"] for p in run["curve"]] == [0, 2, 4]
        assert all(p["neg_log_perplexity"] < 0 for p in run["curve"])
        assert run["final_neg_log_perplexity"] == run["curve"][-1]["neg_log_perplexity"]
        assert run["step_time_s"] > 0
        # The reported curve is the mean of the seeds' curves.
        per_seed = [o["curve"][-1]["neg_log_perplexity"] for o in run["per_seed"]]
        assert run["final_per_seed"] == per_seed and len(per_seed) == 2
        assert run["final_neg_log_perplexity"] == pytest.approx(sum(per_seed) / 2)
        assert run["final_std"] == pytest.approx(abs(per_seed[0] - per_seed[1]) / 2 ** 0.5)
    assert data["runs"]["switch2"]["params"] > data["runs"]["dense"]["params"]
    c = data["comparison"]["switch2"]
    assert set(c) >= {"steps_to_dense_final", "fraction_of_dense_steps",
                      "meets_half_steps_target", "final_gain_over_dense"}
    assert c["final_gain_over_dense"] == pytest.approx(
        data["runs"]["switch2"]["final_neg_log_perplexity"]
        - data["dense_final_neg_log_perplexity"])
    assert data["table1"] == []


def test_translation_bleu_and_smoke():
    from benchmarks.translation import corpus_bleu, language_of, strip_ids

    refs = ["In the beginning God created the heavens and the earth.",
            "The earth was formless and empty."]
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
        for lang in langs:
            sample = run["samples"][lang][0]
            assert sample["reference"] and isinstance(sample["prediction"], str)
    assert {r["language"] for r in data["per_language"]} == langs
    assert data["bleu_self_check"] == 100.0
