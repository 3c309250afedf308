import keras
import numpy as np
import pytest
import tensorflow as tf
from keras import ops

from keras_moe.models import EncoderDecoder, build_model, seqio_to_keras, token_cross_entropy
from tests.models.helpers import tiny_config, tiny_switch_config


def _features(rng, n=16, le=10, ld=8, vocab=40):
    enc = rng.integers(2, vocab, size=(n, le)).astype("int32")
    tgt = np.concatenate([enc[:, : ld - 1], np.ones((n, 1), "int32")], axis=1)  # copy task + EOS
    enc[:, -2:] = 0  # some padding
    tgt[::2, -2:] = 0
    dec_in = np.concatenate([np.zeros((n, 1), "int32"), tgt[:, :-1]], axis=1)
    return {
        "encoder_input_tokens": enc,
        "decoder_input_tokens": dec_in,
        "decoder_target_tokens": tgt,
        "decoder_loss_weights": (tgt > 0).astype("int32"),
    }


def test_forward_shapes_and_moe_losses():
    model = EncoderDecoder(tiny_switch_config())
    feats = _features(np.random.default_rng(0), n=2)
    logits = model(feats)
    assert tuple(logits.shape) == (2, 8, 40) and logits.dtype == "float32"
    num_sparse = len(model.config.resolved_encoder_sparse_layers()) + len(
        model.config.resolved_decoder_sparse_layers()
    )
    assert len(model.losses) == 2 * num_sparse  # aux + z per MoE layer


def test_loss_is_normalised_by_weight_sum(rng):
    y = rng.integers(0, 5, size=(2, 3))
    logits = rng.normal(size=(2, 3, 5)).astype("float32")
    w = np.array([[1.0, 0.0, 2.0], [1.0, 1.0, 0.0]], "float32")
    z = logits - logits.max(-1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(-1, keepdims=True))
    ce = -np.take_along_axis(logp, y[..., None], -1)[..., 0]
    want = (ce * w).sum() / w.sum()
    got = float(token_cross_entropy()(y, logits, sample_weight=w))
    np.testing.assert_allclose(got, want, rtol=1e-5)


@pytest.mark.slow
def test_fit_on_tf_data():
    """fit on a dataset of whole seqio feature dicts; evaluate on (x, y, w) tuples."""
    keras.utils.set_random_seed(0)
    model = build_model(tiny_switch_config())
    model.compile(**model.compile_defaults(optimizer=keras.optimizers.Adam(1e-2)))
    ds = tf.data.Dataset.from_tensor_slices(_features(np.random.default_rng(1), n=32)).batch(8)
    history = model.fit(ds, epochs=3, verbose=0)
    logs = history.history
    for key in ("loss", "accuracy", "neg_log_perplexity"):
        assert key in logs, logs.keys()
    assert logs["loss"][-1] < logs["loss"][0]
    assert logs["neg_log_perplexity"][-1] > logs["neg_log_perplexity"][0]
    as_dict = model.evaluate(ds, verbose=0, return_dict=True)
    as_tuple = model.evaluate(ds.map(seqio_to_keras), verbose=0, return_dict=True)
    for key in ("loss", "accuracy", "neg_log_perplexity"):
        np.testing.assert_allclose(as_tuple[key], as_dict[key], rtol=1e-5)
    # The logged loss is the weighted token loss plus the MoE losses.
    batch = next(iter(ds.map(seqio_to_keras)))
    logits = model(batch[0])
    moe = float(sum(ops.convert_to_numpy(loss) for loss in model.losses))
    ce = float(token_cross_entropy()(batch[1], logits, sample_weight=batch[2]))
    one = model.evaluate(ds.map(seqio_to_keras).take(1), verbose=0, return_dict=True)
    np.testing.assert_allclose(one["loss"], ce + moe, rtol=1e-4)
    assert moe > 0


def test_keras_round_trip(tmp_path):
    model = EncoderDecoder(tiny_switch_config(tie_word_embeddings=True))
    feats = _features(np.random.default_rng(2), n=2)
    inputs = {k: feats[k] for k in ("encoder_input_tokens", "decoder_input_tokens")}
    path = str(tmp_path / "model.keras")
    model.save(path)
    loaded = keras.saving.load_model(path)
    assert isinstance(loaded, EncoderDecoder)
    assert loaded.config == model.config
    np.testing.assert_allclose(
        ops.convert_to_numpy(loaded(inputs)), ops.convert_to_numpy(model(inputs)), atol=1e-6
    )


ENC = np.array([[5, 6, 7, 8, 1, 0], [9, 10, 11, 12, 13, 1]], "int32")


@pytest.fixture(scope="module")
def decode_model():
    keras.utils.set_random_seed(3)
    # Room for every token of the uncached pass (2 rows x 3 beams x 7 positions in
    # one "batch" group): cached and uncached decoding then route alike.
    return EncoderDecoder(tiny_switch_config(vocab_size=24, min_expert_capacity=64))


@pytest.mark.parametrize("method", ["greedy", "beam"])
def test_cached_equals_uncached(decode_model, method):
    a = decode_model.generate(ENC, max_length=7, method=method, num_beams=3)
    b = decode_model.generate(ENC, max_length=7, method=method, num_beams=3, use_cache=False)
    np.testing.assert_array_equal(a, b)
    assert a.shape[0] == 2 and a.shape[1] <= 7


def test_greedy_is_argmax_of_teacher_forcing(decode_model):
    tokens = decode_model.generate(ENC, max_length=6)
    dec_in = np.concatenate([np.zeros((2, 1), "int32"), tokens[:, :-1]], axis=1)
    logits = ops.convert_to_numpy(
        decode_model({"encoder_input_tokens": ENC, "decoder_input_tokens": dec_in})
    )
    argmax = logits.argmax(-1)
    for row in range(2):
        n = tokens.shape[1]
        eos = np.where(tokens[row] == 1)[0]
        n = eos[0] + 1 if len(eos) else n
        np.testing.assert_array_equal(argmax[row, :n], tokens[row, :n])


def test_beam_scores_at_least_greedy(decode_model):
    from keras_moe.models.decoding import generate

    g_tok, g_score = generate(decode_model, ENC, max_length=6, return_scores=True)
    one_tok, _ = generate(
        decode_model, ENC, max_length=6, method="beam", num_beams=1, return_scores=True
    )
    np.testing.assert_array_equal(g_tok, one_tok)
    _, b_score = generate(
        decode_model, ENC, max_length=6, method="beam", num_beams=4, return_scores=True
    )
    assert (b_score >= g_score - 1e-5 * np.abs(g_score)).all()  # float32 scores


def test_eos_stops_decoding():
    model = EncoderDecoder(tiny_config(vocab_size=24))
    assert model.generate(ENC, max_length=3).shape == (2, 3)
    original = model.logits
    step = {"n": 0}

    def eos_at_second_step(x):  # row 0 emits EOS at step 1, row 1 at step 2
        out = original(x)
        step["n"] += 1
        boost = np.zeros((2, 24), "float32")
        if step["n"] == 2:
            boost[0, 1] = 1e4
        if step["n"] == 3:
            boost[1, 1] = 1e4
        return out + ops.reshape(boost, (2,) + (1,) * (len(out.shape) - 2) + (24,))

    model.logits = eos_at_second_step  # counts Python calls: the eager reference loop
    tokens = model.generate(ENC, max_length=6, compiled=False)
    assert step["n"] == 3 and tokens.shape == (2, 3)  # stopped once both rows finished
    assert tokens[0, 1] == 1 and tokens[0, 2] == 0  # padding after EOS
    assert tokens[1, 2] == 1


def test_generate_rejects_bad_arguments(decode_model):
    with pytest.raises(ValueError, match="`method`"):
        decode_model.generate(ENC, method="sample")
    with pytest.raises(ValueError, match="`max_length`"):
        decode_model.generate(ENC, max_length=0)
