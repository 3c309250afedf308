"""tasks.get_dataset, vocabularies and the embedded tasks."""

import gzip
import os

import numpy as np
import pytest
import seqio

from keras_moe import tasks
from keras_moe.tasks import embedded
from tests.tasks import helpers

LENGTHS = {"inputs": 64, "targets": 16}
PACKED = {
    "encoder_input_tokens",
    "decoder_input_tokens",
    "decoder_target_tokens",
    "decoder_loss_weights",
    "encoder_segment_ids",
    "decoder_segment_ids",
    "encoder_positions",
    "decoder_positions",
}


def _batches(seed, n=2, name="embedded_span_corruption_byte", **kw):
    ds = tasks.get_dataset(name, LENGTHS, batch_size=3, shuffle=True, seed=seed, **kw)
    return [{k: v.numpy() for k, v in b.items()} for b in ds.take(n)]


@pytest.mark.slow
def test_get_dataset_is_packed_batched_and_deterministic():
    a, b, c = _batches(7), _batches(7), _batches(8)
    assert set(a[0]) == PACKED
    for x, y in zip(a, b, strict=False):
        for k in PACKED:
            np.testing.assert_array_equal(x[k], y[k])
    assert any(
        not np.array_equal(x["encoder_input_tokens"], z["encoder_input_tokens"])
        for x, z in zip(a, c, strict=False)
    )
    assert a[0]["encoder_input_tokens"].shape == (3, 64)
    assert a[0]["decoder_target_tokens"].shape == (3, 16)
    unpacked = _batches(7, n=1, pack=False)[0]
    assert set(unpacked) == PACKED - {
        "encoder_segment_ids",
        "decoder_segment_ids",
        "encoder_positions",
        "decoder_positions",
    }


def test_get_dataset_validates_arguments():
    with pytest.raises(ValueError, match="embedded_span_corruption"):
        tasks.get_dataset("embedded_span_corruptoin", LENGTHS)
    with pytest.raises(ValueError, match="sequence_length"):
        tasks.get_dataset("embedded_x2en", {"inputs": 64})
    with pytest.raises(ValueError, match="batch_size"):
        tasks.get_dataset("embedded_x2en", LENGTHS, batch_size=0)


def test_vocabularies():
    sp, byte = tasks.get_vocabulary(), tasks.get_vocabulary("byte")
    assert isinstance(sp, seqio.SentencePieceVocabulary)
    assert sp.vocab_size == tasks.vocabulary_size() == 8000 + 100
    assert byte.vocab_size == tasks.vocabulary_size("byte") == 256 + 3 + 100
    text = "Car Dieu a tant aimé le monde"
    assert sp.decode(sp.encode(text)) == text
    assert (sp.eos_id, sp.pad_id) == (1, 0)
    assert len(sp.encode(text)) < len(byte.encode(text)) / 2
    with pytest.raises(ValueError, match="kind"):
        tasks.get_vocabulary("wordpiece")
    assert tasks.vocab.SENTENCEPIECE_MODEL.startswith(os.path.dirname(tasks.__file__))


def test_embedded_data_is_small_and_inside_the_package():
    data = os.path.join(os.path.dirname(tasks.__file__), "data")
    total = sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(data) for f in files)
    assert total < 3 * 2**20
    assert os.path.isfile(os.path.join(data, "NOTICE.md"))


def _verse_count(lang):
    with gzip.open(
        os.path.join(embedded.EMBEDDED_DIR, f"bible_{lang}.tsv.gz"), "rt", encoding="utf-8"
    ) as f:
        rows = [line.split("\t") for line in f]
    return sum(
        1 for b, c, _, t in rows if t.strip() and helpers.chapter_split(int(b), int(c)) == "train"
    )


def test_embedded_x2en_mixture_rates_and_examples():
    mixture = seqio.get_mixture_or_task("embedded_x2en")
    t = embedded.DEFAULT_TEMPERATURE
    weights = {lang: _verse_count(lang) ** (1 / t) for lang in ("fr", "es", "it")}
    for task in mixture.tasks:
        lang = task.name.split("_")[1]
        assert mixture.get_rate(task) / mixture.total_rate == pytest.approx(
            weights[lang] / sum(weights.values())
        )
    ds = tasks.get_dataset(
        "embedded_x2en",
        {"inputs": 128, "targets": 128},
        split="validation",
        batch_size=4,
        seed=0,
        pack=False,
    )
    batch = next(iter(ds))
    vocab = tasks.get_vocabulary()
    for row in batch["encoder_input_tokens"].numpy():
        assert vocab.decode([int(i) for i in row if i > 1]).startswith("translate ")


def test_embedded_pairs_split_by_chapter():
    chapters = {
        s: {(b, c) for b, c, *_ in embedded.aligned_pairs("fr", s)}
        for s in ("train", "validation", "test")
    }
    assert chapters["validation"] and chapters["test"]
    assert not chapters["train"] & (chapters["validation"] | chapters["test"])
    assert not chapters["validation"] & chapters["test"]


def test_missing_embedded_file_names_the_script(tmp_path, monkeypatch):
    monkeypatch.setattr(embedded, "EMBEDDED_DIR", str(tmp_path))
    with pytest.raises(tasks.SourceMissingError, match="scripts/make_embedded_corpus.py"):
        embedded.aligned_pairs("it", "train")
