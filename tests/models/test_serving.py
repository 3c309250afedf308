"""The serving SavedModel, loaded where keras_moe cannot be imported."""

import json
import os
import re
import shutil
import subprocess
import sys

import keras
import numpy as np
import pytest

from keras_moe.models import EncoderDecoder
from keras_moe.models.serving import decode_with_vocabulary, export_for_serving
from keras_moe.tasks.vocab import get_vocabulary
from tests.models.helpers import tiny_switch_config

MAX_INPUT, MAX_LENGTH = 12, 8
IDS = [[5, 6, 7, 1], [900, 31, 402, 77, 1], [12, 1]]
TEXTS = ["In the beginning was the word", "Python is a programming language", "Hello"]
DECODING = dict(max_length=MAX_LENGTH, method="beam", num_beams=3, length_penalty=0.6)

# Runs in a fresh interpreter where keras_moe and its tasks cannot be imported
# (tensorflow_text itself imports Keras).
LOADER = """
import json, sys
sys.modules["keras_moe"] = None  # and with it keras_moe.tasks
import tensorflow as tf
import tensorflow_text  # the SentencePiece ops of the text signature
served = tf.saved_model.load(sys.argv[1])
ids = served.signatures["generate_ids"](encoder_input_tokens=tf.constant(json.loads(sys.argv[2])))
text = served.signatures["generate_text"](inputs=tf.constant(json.loads(sys.argv[3])))
print(json.dumps({"tokens": ids["output_tokens"].numpy().tolist(),
                  "scores": ids["scores"].numpy().tolist(),
                  "texts": [t.decode() for t in text["outputs"].numpy()],
                  "signatures": sorted(served.signatures)}))
"""


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    vocabulary = get_vocabulary()
    keras.utils.set_random_seed(1)
    model = EncoderDecoder(
        tiny_switch_config(vocab_size=vocabulary.vocab_size, min_expert_capacity=32)
    )
    path = export_for_serving(
        model,
        str(tmp_path_factory.mktemp("served") / "model"),
        vocabulary=vocabulary,
        max_input_length=MAX_INPUT,
        **DECODING,
    )
    return model, vocabulary, path


def _padded(ids):
    out = np.zeros((len(ids), MAX_INPUT), "int32")
    for row, seq in enumerate(ids):
        out[row, : len(seq)] = seq
    return out


@pytest.mark.e2e
def test_the_saved_model_runs_without_keras_moe_and_matches_generate(exported):
    model, vocabulary, path = exported
    width = max(len(s) for s in IDS)
    result = subprocess.run(
        [
            sys.executable,
            "-c",
            LOADER,
            path,
            json.dumps(_padded(IDS)[:, :width].tolist()),
            json.dumps(TEXTS),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"),
        cwd="/",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    served = json.loads(result.stdout.strip().splitlines()[-1])
    assert served["signatures"] == ["generate_ids", "generate_text", "serving_default"]

    tokens, scores = model.generate(_padded(IDS), return_scores=True, **DECODING)
    expected = np.zeros((len(IDS), MAX_LENGTH), "int32")
    expected[:, : tokens.shape[1]] = tokens  # the signature returns all max_length slots
    np.testing.assert_array_equal(np.array(served["tokens"]), expected)
    np.testing.assert_allclose(served["scores"], scores, rtol=1e-5)
    assert served["texts"] == decode_with_vocabulary(
        model, TEXTS, vocabulary, MAX_INPUT, **DECODING
    )
    assert any(served["texts"])  # the comparison is not between empty strings


@pytest.mark.e2e
def test_saved_model_cli_runs_the_token_signature(exported, tmp_path):
    # saved_model_cli loads every op of the graph and has no tensorflow_text
    # SentencePiece ops, so it runs a SavedModel exported without a vocabulary.
    model = exported[0]
    path = export_for_serving(
        model, str(tmp_path / "ids_only"), max_input_length=MAX_INPUT, **DECODING
    )
    cli = shutil.which("saved_model_cli", path=os.path.dirname(sys.executable))
    assert cli, "saved_model_cli comes with tensorflow"
    inputs = str(tmp_path / "inputs.npy")
    np.save(inputs, np.array([IDS[0]], "int32"))
    result = subprocess.run(
        [
            cli,
            "run",
            "--dir",
            path,
            "--tag_set",
            "serve",
            "--signature_def",
            "generate_ids",
            "--inputs",
            f"encoder_input_tokens={inputs}",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"),
    )
    assert result.returncode == 0, result.stderr[-3000:]
    printed = re.search(r"output_tokens:\s*\n(\[\[.*?\]\])", result.stdout, re.S)
    assert printed, result.stdout
    expected = model.generate(_padded([IDS[0]]), **DECODING)[0]
    got = np.array(json.loads(re.sub(r"\s+", ",", printed.group(1).replace("[ ", "["))))
    np.testing.assert_array_equal(got[0, : len(expected)], expected)


@pytest.mark.e2e
def test_export_rejects_bad_arguments(tmp_path):
    model = EncoderDecoder(tiny_switch_config())
    with pytest.raises(ValueError, match="`max_input_length`"):
        export_for_serving(model, str(tmp_path), max_input_length=0)
    with pytest.raises(ValueError, match="`method`"):
        export_for_serving(model, str(tmp_path), method="sample")
    with pytest.raises(ValueError, match="`vocabulary`"):
        export_for_serving(model, str(tmp_path), vocabulary=object())
    with pytest.raises(ValueError, match="`length_normalizer`.*'gnmt', 'hf'"):
        export_for_serving(model, str(tmp_path), length_normalizer="t5")


@pytest.fixture(scope="module")
def crowded(tmp_path_factory):
    """An ids-only export of a model whose batch-wide groups drop tokens (one slot
    per expert), loaded back."""
    import tensorflow as tf

    keras.utils.set_random_seed(2)
    model = EncoderDecoder(
        tiny_switch_config(
            vocab_size=1000,
            encoder_sparse_step=1,
            eval_capacity_factor=0.25,
            min_expert_capacity=1,
            group_size="batch",
        )
    )
    path = export_for_serving(
        model,
        str(tmp_path_factory.mktemp("crowded") / "model"),
        max_input_length=MAX_INPUT,
        **DECODING,
    )
    return model, tf.saved_model.load(path).signatures["generate_ids"]


def _serve(signature, ids):
    import tensorflow as tf

    out = signature(encoder_input_tokens=tf.constant(ids, tf.int32))
    return out["output_tokens"].numpy(), out["scores"].numpy()


@pytest.mark.e2e
def test_overlong_inputs_are_cut_keeping_their_eos(crowded):
    """As seqio's append_eos_after_trim: the first MAX_INPUT - 1 tokens, then EOS."""
    model, signature = crowded
    long_ids = [list(range(100, 100 + 2 * MAX_INPUT)) + [1], [7, 8, 1]]
    tokens, scores = _serve(signature, _padded_to(long_ids, 2 * MAX_INPUT + 1))
    trimmed = _padded([long_ids[0][: MAX_INPUT - 1] + [1], long_ids[1]])
    want, want_scores = model.generate(trimmed, return_scores=True, **DECODING)
    np.testing.assert_array_equal(tokens[:, : want.shape[1]], want)
    np.testing.assert_allclose(scores, want_scores, rtol=1e-5)


@pytest.mark.e2e
def test_co_batched_requests_do_not_change_each_other(crowded):
    _, signature = crowded
    requests = _padded([[5, 6, 7, 8, 9, 1], [900, 31, 402, 77, 1], [12, 13, 14, 1]])
    tokens, scores = _serve(signature, requests)
    for row in range(len(requests)):
        alone_tokens, alone_scores = _serve(signature, requests[row : row + 1])
        np.testing.assert_array_equal(alone_tokens[0], tokens[row])
        np.testing.assert_allclose(alone_scores[0], scores[row], rtol=1e-5)


def _padded_to(ids, width):
    out = np.zeros((len(ids), width), "int32")
    for row, seq in enumerate(ids):
        out[row, : len(seq)] = seq
    return out


def test_export_of_a_never_called_model_names_the_ways_out(tmp_path):
    import tensorflow as tf

    keras.utils.set_random_seed(3)
    model = EncoderDecoder(tiny_switch_config())
    with pytest.raises(ValueError, match="input_signature.*export_for_serving"):
        model.export(str(tmp_path / "logits"))
    spec = {
        "encoder_input_tokens": tf.TensorSpec([None, 7], tf.int32),
        "decoder_input_tokens": tf.TensorSpec([None, 5], tf.int32),
    }
    model.export(str(tmp_path / "logits"), input_signature=[spec])
    inputs = {
        "encoder_input_tokens": np.array([[5, 6, 7, 1, 0, 0, 0]], "int32"),
        "decoder_input_tokens": np.array([[0, 3, 4, 5, 6]], "int32"),
    }
    served = tf.saved_model.load(str(tmp_path / "logits"))
    np.testing.assert_allclose(
        served.serve(inputs).numpy(), np.asarray(model(inputs)), rtol=1e-5, atol=1e-5
    )


@pytest.mark.e2e
def test_export_ranks_beams_with_the_chosen_length_normalizer(tmp_path):
    import tensorflow as tf

    keras.utils.set_random_seed(4)
    model = EncoderDecoder(tiny_switch_config(vocab_size=8, min_expert_capacity=32))
    requests = np.random.default_rng(0).integers(2, 8, (12, 6)).astype("int32")
    requests[:, -1] = 1
    hf = dict(max_length=MAX_LENGTH, method="beam", num_beams=2, length_penalty=1.0)
    path = export_for_serving(
        model, str(tmp_path / "hf"), max_input_length=6, length_normalizer="hf", **hf
    )
    tokens, scores = _serve(tf.saved_model.load(path).signatures["generate_ids"], requests)
    want, want_scores = model.generate(requests, return_scores=True, length_normalizer="hf", **hf)
    np.testing.assert_array_equal(tokens[:, : want.shape[1]], want)
    np.testing.assert_allclose(scores, want_scores, rtol=1e-5)
    gnmt = model.generate(requests, **hf)
    width = max(want.shape[1], gnmt.shape[1])
    pad = lambda t: np.pad(t, ((0, 0), (0, width - t.shape[1])))  # noqa: E731
    assert (pad(gnmt) != pad(want)).any()  # the export did not rank as "gnmt" does
