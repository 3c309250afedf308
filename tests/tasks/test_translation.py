"""WMT tasks: T5 translate recipe on local pairs, BLEU, missing TFDS data."""

import pytest
import sacrebleu
import seqio
import tensorflow as tf

from keras_moe import tasks
from keras_moe.tasks import translation
from keras_moe.tasks.tfds_source import CheckedTfdsSource

NAMES = ["wmt14_ende", "wmt14_enfr", "wmt16_enro", "wmt19_ende", "wmt14_deen"]


def test_wmt_tasks_are_registered_with_the_tfds_sources():
    expected = {
        "wmt14_ende": "wmt14_translate/de-en:1.0.0",
        "wmt14_enfr": "wmt14_translate/fr-en:1.0.0",
        "wmt16_enro": "wmt16_translate/ro-en:1.0.0",
        "wmt19_ende": "wmt19_translate/de-en:1.0.0",
    }
    for name, tfds_name in expected.items():
        for kind in tasks.VOCAB_KINDS:
            task = seqio.get_mixture_or_task(tasks.task_name(name, kind))
            assert task.source.tfds_dataset.name == tfds_name
            assert task.metric_fns


def test_wmt_recipe_on_local_pairs():
    pairs = {
        "de": ["Das Haus ist klein.", "Guten Morgen."],
        "en": ["The house is small.", "Good morning."],
    }
    name = "wmt_local_test"
    if name in seqio.TaskRegistry.names():
        seqio.TaskRegistry.remove(name)
    task = seqio.TaskRegistry.add(
        name,
        source=seqio.FunctionDataSource(
            lambda split, shuffle_files: tf.data.Dataset.from_tensor_slices(pairs), splits=["train"]
        ),
        preprocessors=translation.translation_preprocessors("en", "de"),
        output_features=tasks.output_features(),
    )
    vocab = tasks.get_vocabulary()
    out = list(task.get_dataset({"inputs": 64, "targets": 64}, shuffle=False).as_numpy_iterator())
    for ex, en, de in zip(out, pairs["en"], pairs["de"], strict=False):
        assert ex["inputs_pretokenized"].decode() == (f"translate English to German: {en}")
        assert ex["inputs"].tolist() == vocab.encode(f"translate English to German: {en}") + [1]
        assert ex["targets"].tolist() == vocab.encode(de) + [1]


def test_bleu_matches_sacrebleu():
    refs = ["The house is small.", "Good morning to you all."]
    preds = ["The house is tiny.", "Good morning to all."]
    expected = sacrebleu.corpus_bleu(preds, [refs], tokenize="intl").score
    assert tasks.metrics.bleu(refs, preds)["bleu"] == pytest.approx(expected)
    assert tasks.metrics.bleu(refs, refs)["bleu"] == pytest.approx(100.0)
    with pytest.raises(ValueError, match="length"):
        tasks.metrics.bleu(refs, preds[:1])


@pytest.mark.parametrize("name", ["c4_span_corruption", "wmt14_ende"])
def test_missing_tfds_data_names_the_fix(tmp_path, name):
    task = seqio.get_mixture_or_task(name)
    source = CheckedTfdsSource(
        task.source.tfds_dataset.name, fix=task.source._fix, tfds_data_dir=str(tmp_path)
    )
    with pytest.raises(tasks.SourceMissingError, match="tfds build") as err:
        source.get_dataset("train")
    assert task.source.tfds_dataset.name.split(":")[0] in str(err.value)
    assert str(tmp_path) in str(err.value)
