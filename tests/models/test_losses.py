"""The T5 loss and metric against a float64 NumPy reference."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from keras_moe.models import NegLogPerplexity, TokenCrossEntropy, token_log_likelihood


def _reference_log_probs(logits):
    logits = logits.astype("float64")
    z = logits - logits.max(-1, keepdims=True)
    return z - np.log(np.exp(z).sum(-1, keepdims=True))


@pytest.fixture
def case():
    rng = np.random.default_rng(3)
    targets = rng.integers(0, 50, size=(3, 7)).astype("int32")
    logits = (4.0 * rng.normal(size=(3, 7, 50))).astype("float32")
    weights = (rng.random(size=(3, 7)) > 0.3).astype("float32")
    return targets, logits, weights


def test_log_likelihood_and_its_gradient_match_float64(case):
    targets, logits, _ = case
    logp = _reference_log_probs(logits)
    want = np.take_along_axis(logp, targets[..., None], -1)[..., 0]
    x = tf.constant(logits)
    with tf.GradientTape() as tape:
        tape.watch(x)
        got = token_log_likelihood(targets, x)
        total = tf.reduce_sum(got)
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-5, atol=1e-5)
    # d/dlogits sum(log p(target)) = onehot(target) - softmax(logits)
    want_grad = np.eye(50)[targets] - np.exp(logp)
    np.testing.assert_allclose(tape.gradient(total, x).numpy(), want_grad, atol=1e-6)


def test_log_likelihood_matches_keras_sparse_cross_entropy_on_extreme_logits(case):
    targets, logits, _ = case
    logits = logits * 100.0  # softmax saturates: log-probabilities of -1e3 and more
    want = -keras.losses.sparse_categorical_crossentropy(targets, logits, from_logits=True)
    got = token_log_likelihood(targets, logits)
    assert np.all(np.isfinite(got))
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-3)


def test_loss_and_metric_are_weighted_means(case):
    targets, logits, weights = case
    ll = np.take_along_axis(_reference_log_probs(logits), targets[..., None], -1)[..., 0]
    want = (ll * weights).sum() / weights.sum()
    loss = TokenCrossEntropy()(targets, logits, sample_weight=weights)
    np.testing.assert_allclose(float(loss), -want, rtol=1e-5)
    metric = NegLogPerplexity()
    metric.update_state(targets[:2], logits[:2], sample_weight=weights[:2])
    metric.update_state(targets[2:], logits[2:], sample_weight=weights[2:])
    np.testing.assert_allclose(float(metric.result()), want, rtol=1e-5)


def test_bfloat16_logits_are_scored_in_float32(case):
    targets, logits, _ = case
    got = token_log_likelihood(targets, keras.ops.cast(logits, "bfloat16"))
    assert keras.backend.standardize_dtype(got.dtype) == "float32"
    want = np.take_along_axis(_reference_log_probs(logits), targets[..., None], -1)[..., 0]
    # bfloat16 keeps 8 bits of mantissa: logits of |x| < 16 move by at most 0.0625.
    np.testing.assert_allclose(np.asarray(got), want, atol=0.25)


def test_loss_round_trips_through_config():
    loss = TokenCrossEntropy()
    again = keras.losses.deserialize(keras.losses.serialize(loss))
    assert isinstance(again, TokenCrossEntropy) and again.name == "token_cross_entropy"
