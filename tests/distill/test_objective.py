"""The hard/soft mix against a float64 hand computation and Keras' own cross-entropy."""

import keras
import numpy as np
import pytest

from keras_moe.distill import distillation_objective as losses
from tests.distill.helpers import np_distillation_loss


def _case(rng, vocab=7):
    labels = rng.integers(0, vocab, (3, 5))
    student = rng.normal(size=(3, 5, vocab)).astype("float32") * 2
    teacher = rng.normal(size=(3, 5, vocab)).astype("float32") * 3
    weights = (rng.random((3, 5)) > 0.3).astype("float32")
    weights[0, 0] = 1.0
    return labels, student, teacher, weights


@pytest.mark.parametrize(
    "alpha,temperature,scale",
    [
        (0.25, 1.0, True),
        (0.25, 2.0, True),
        (0.25, 2.0, False),
        (0.0, 3.0, True),
        (1.0, 0.5, True),
        (0.6, 1.7, False),
    ],
)
def test_mix_equals_hand_computation(rng, alpha, temperature, scale):
    labels, student, teacher, weights = _case(rng)
    loss, hard, soft = losses.distillation_loss(
        labels,
        student,
        teacher,
        weights,
        alpha=alpha,
        temperature=temperature,
        scale_soft_loss=scale,
    )
    ref, ref_hard, ref_soft, ref_kl = np_distillation_loss(
        labels, student, teacher, weights, alpha, temperature, scale
    )
    np.testing.assert_allclose(float(loss), ref, rtol=1e-5)
    np.testing.assert_allclose(float(hard), ref_hard, rtol=1e-5)
    np.testing.assert_allclose(float(soft), ref_soft, rtol=1e-5)
    kl = losses.kl_to_teacher(teacher, student, weights, temperature)
    np.testing.assert_allclose(float(kl), ref_kl, rtol=1e-4, atol=1e-6)


def test_paper_default_is_three_quarters_hard(rng):
    labels, student, teacher, weights = _case(rng)
    loss, hard, soft = losses.distillation_loss(labels, student, teacher, weights)
    np.testing.assert_allclose(float(loss), 0.75 * float(hard) + 0.25 * float(soft), rtol=1e-6)


def test_hard_term_is_the_t5_loss(rng):
    labels, student, _, weights = _case(rng)
    keras_loss = keras.losses.SparseCategoricalCrossentropy(
        from_logits=True, reduction="mean_with_sample_weight"
    )(labels, student, weights)
    np.testing.assert_allclose(
        float(losses.hard_loss(labels, student, weights)), float(keras_loss), rtol=1e-5
    )


def test_padding_does_not_count(rng):
    labels, student, teacher, weights = _case(rng)
    weights[:, -1] = 0.0
    changed = teacher.copy()
    changed[:, -1] += 50 * rng.normal(size=changed[:, -1].shape)
    a = losses.distillation_loss(labels, student, teacher, weights, temperature=2.0)[0]
    b = losses.distillation_loss(labels, student, changed, weights, temperature=2.0)[0]
    np.testing.assert_allclose(float(a), float(b), rtol=1e-6)


def test_kl_is_zero_for_identical_logits_and_soft_is_teacher_entropy(rng):
    _, student, _, weights = _case(rng)
    assert abs(float(losses.kl_to_teacher(student, student, weights))) < 1e-5
    soft = float(losses.soft_loss(student, student, weights))
    p = np.exp(student - student.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    entropy = -(p * np.log(p)).sum(-1)
    np.testing.assert_allclose(soft, (entropy * weights).sum() / weights.sum(), rtol=1e-5)


def test_no_gradient_flows_into_the_teacher(rng):
    import tensorflow as tf

    labels, student, teacher, weights = _case(rng)
    t = tf.Variable(teacher)
    with tf.GradientTape() as tape:
        loss = losses.distillation_loss(labels, student, t, weights, alpha=1.0)[0]
    assert tape.gradient(loss, t) is None


@pytest.mark.parametrize("alpha", [-0.01, 1.01, True, "0.5", None])
def test_bad_alpha(alpha):
    with pytest.raises(ValueError, match="alpha"):
        losses.check_alpha(alpha)


@pytest.mark.parametrize("temperature", [0, 0.0, -1.0, True, None])
def test_bad_temperature(temperature):
    with pytest.raises(ValueError, match="temperature"):
        losses.check_temperature(temperature)
