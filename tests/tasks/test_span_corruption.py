"""Span corruption over the embedded corpus and over a local C4-like file."""

import functools
import json

import pytest
import seqio
import tensorflow as tf

from keras_moe import tasks
from keras_moe.tasks import c4
from tests.tasks import helpers

LENGTHS = {"inputs": 64, "targets": 32}


def _check_reconstruction(examples, docs_tokens, vocab_size):
    """Merged examples, concatenated, are the start of the token stream."""
    stream = [t for doc in docs_tokens for t in doc]
    merged_all, noise_tokens = [], 0
    for ex in examples:
        assert len(ex["inputs"]) <= LENGTHS["inputs"]
        assert len(ex["targets"]) <= LENGTHS["targets"]
        merged, n_spans = helpers.merge_span_corruption(ex["inputs"], ex["targets"], vocab_size)
        assert n_spans >= 1
        noise_tokens += len(merged) - (len(helpers.strip_eos(ex["inputs"])) - n_spans)
        merged_all.extend(merged)
    assert merged_all == stream[: len(merged_all)]
    # T5's 15% noise density (rounded per example).
    assert 0.10 < noise_tokens / len(merged_all) < 0.20
    # Full-length inputs: examples are merged to reduce padding.
    assert sum(len(ex["inputs"]) == LENGTHS["inputs"] for ex in examples) >= (len(examples) - 1)


@pytest.mark.parametrize("kind", ["sentencepiece", "byte"])
def test_embedded_span_corruption_reconstructs_the_text(kind):
    task = seqio.get_mixture_or_task(tasks.task_name("embedded_span_corruption", kind))
    examples = list(
        task.get_dataset(LENGTHS, split="validation", shuffle=False, seed=3)
        .take(20)
        .as_numpy_iterator()
    )
    assert len(examples) == 20
    vocab = tasks.get_vocabulary(kind)
    docs = tasks.embedded.english_documents("validation")
    _check_reconstruction(examples, [vocab.encode(d["text"]) for d in docs], vocab.vocab_size)


def _c4_like_file(tmp_path):
    """A small JSON-lines file shaped like TFDS c4 examples (real prose)."""
    docs = [d["text"] for d in tasks.embedded.english_documents("test")[:6]]
    path = tmp_path / "c4_sample.jsonl"
    with open(path, "w") as f:
        for i, text in enumerate(docs):
            f.write(
                json.dumps(
                    {
                        "text": text,
                        "url": f"https://example.org/{i}",
                        "timestamp": "2019-04-25T12:57:54Z",
                    }
                )
                + "\n"
            )
    return str(path), docs


def _local_c4_task(name, path, objective):
    """A task like c4_* but over a local file, with c4_preprocessors()."""

    def dataset_fn(split, shuffle_files, seed=None):
        del split, shuffle_files, seed
        with open(path) as f:
            rows = [json.loads(line) for line in f]
        return tf.data.Dataset.from_tensor_slices(
            {k: [r[k] for r in rows] for k in ("text", "url", "timestamp")}
        )

    if name in seqio.TaskRegistry.names():
        seqio.TaskRegistry.remove(name)
    return seqio.TaskRegistry.add(
        name,
        source=seqio.FunctionDataSource(dataset_fn, splits=["train"]),
        preprocessors=c4.c4_preprocessors(objective),
        output_features=tasks.output_features("byte"),
    )


def test_c4_preprocessors_are_the_registered_ones():
    for objective, name in [
        ("span_corruption", "c4_span_corruption"),
        ("prefix_lm", "c4_prefix_lm"),
    ]:
        registered = seqio.get_mixture_or_task(name).preprocessors
        built = c4.c4_preprocessors(objective)
        assert len(registered) == len(built)
        for a, b in zip(registered, built, strict=False):
            if isinstance(a, functools.partial):
                assert (a.func, a.keywords) == (b.func, b.keywords)
            else:
                assert type(a) is type(b)
    source = seqio.get_mixture_or_task("c4_span_corruption").source
    assert source.tfds_dataset.name == "c4/en:3.0.1"


def test_c4_span_corruption_end_to_end_on_local_file(tmp_path):
    path, docs = _c4_like_file(tmp_path)
    task = _local_c4_task("c4_local_span_test", path, "span_corruption")
    examples = list(
        task.get_dataset(LENGTHS, split="train", shuffle=False, seed=0).as_numpy_iterator()
    )
    assert len(examples) > 20
    vocab = tasks.get_vocabulary("byte")
    _check_reconstruction(examples[:-1], [vocab.encode(d) for d in docs], vocab.vocab_size)
    # Packed, batched EncDec features through the same helper as training.
    ds = tasks.get_dataset("c4_local_span_test", LENGTHS, batch_size=2, seed=0)
    batch = next(iter(ds))
    assert batch["encoder_input_tokens"].shape == (2, 64)
    assert batch["decoder_target_tokens"].shape == (2, 32)


def test_c4_prefix_lm_end_to_end_on_local_file(tmp_path):
    path, docs = _c4_like_file(tmp_path)
    task = _local_c4_task("c4_local_prefix_test", path, "prefix_lm")
    vocab = tasks.get_vocabulary("byte")
    doc_tokens = [vocab.encode(d) for d in docs]
    examples = list(
        task.get_dataset(LENGTHS, split="train", shuffle=False, seed=0).take(10).as_numpy_iterator()
    )
    for ex in examples:
        prefix, suffix = helpers.strip_eos(ex["inputs"]), helpers.strip_eos(ex["targets"])
        assert prefix and suffix
        assert max(prefix + suffix) < 256 + 3  # No sentinels in prefix LM.
        assert any(helpers.is_sublist(prefix + suffix, d) for d in doc_tokens)


def test_span_corruption_rejects_short_targets():
    task = seqio.get_mixture_or_task("embedded_span_corruption_byte")
    needed = tasks.span_corruption_targets_length(64)
    with pytest.raises(ValueError, match="targets length"):
        next(
            iter(
                task.get_dataset(
                    {"inputs": 64, "targets": needed - 1}, split="validation", shuffle=False, seed=0
                )
            )
        )
