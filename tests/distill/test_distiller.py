"""`Distiller`: its loss, what it trains, what it freezes, its arguments."""

import keras
import numpy as np
import pytest

from keras_moe.distill import Distiller, dense_student_config, init_student_from_teacher
from keras_moe.models import build_model
from tests.distill.helpers import batch, np_distillation_loss, teacher_config


def _pair(seed=0, **teacher_overrides):
    keras.utils.set_random_seed(seed)
    teacher = build_model(teacher_config(**teacher_overrides))
    student = build_model(dense_student_config(teacher.config, dropout_rate=0.0))
    init_student_from_teacher(student, teacher)
    return teacher, student


def test_loss_equals_hand_computation_with_teacher_in_inference_mode(rng):
    # Dropout and jitter in the teacher: a teacher run with training=True
    # would give other (random) logits and so another loss.
    teacher, student = _pair(dropout_rate=0.5, jitter_noise=0.5, eval_capacity_factor=2.0)
    x, y, w = batch(rng)
    distiller = Distiller(teacher, student, alpha=0.25, temperature=2.0)
    student_logits = np.asarray(student(x, training=False))
    teacher_logits = np.asarray(teacher(x, training=False))
    assert not np.allclose(np.asarray(teacher(x, training=True)), teacher_logits)
    expected = np_distillation_loss(y, student_logits, teacher_logits, w, 0.25, 2.0)[0]
    for _ in range(2):
        loss = distiller.compute_loss(x, y, student_logits, w, training=True)
        np.testing.assert_allclose(float(loss), expected, rtol=1e-5)


def test_targets_and_weights_from_the_feature_dict(rng):
    teacher, student = _pair()
    x, y, w = batch(rng)
    distiller = Distiller(teacher, student, alpha=0.5)
    features = dict(x, decoder_target_tokens=y, decoder_loss_weights=w)
    logits = np.asarray(student(x))
    expected = np_distillation_loss(y, logits, np.asarray(teacher(x, training=False)), w, 0.5, 1.0)[
        0
    ]
    np.testing.assert_allclose(
        float(distiller.compute_loss(features, None, logits)), expected, rtol=1e-5
    )


@pytest.mark.slow
def test_fit_moves_student_toward_teacher_and_freezes_teacher(rng):
    teacher, student = _pair(seed=3)
    x, y, w = batch(rng, batch_size=8)
    distiller = Distiller(teacher, student, alpha=1.0, temperature=2.0)
    assert {id(v) for v in distiller.trainable_variables} == {
        id(v) for v in student.trainable_variables
    }
    assert not teacher.trainable_variables
    teacher_before = [np.array(v.numpy()) for v in teacher.weights]
    student_before = [np.array(v.numpy()) for v in student.trainable_variables]

    def kl():
        ref = np_distillation_loss(
            y,
            np.asarray(student(x, training=False)),
            np.asarray(teacher(x, training=False)),
            w,
            1.0,
            2.0,
        )
        return ref[3]

    kl_before = kl()
    distiller.compile(**distiller.compile_defaults(optimizer=keras.optimizers.Adam(3e-2)))
    history = distiller.fit(x, y, sample_weight=w, epochs=8, batch_size=8, verbose=0).history
    kl_after = kl()
    assert kl_after < 0.5 * kl_before, (kl_before, kl_after)
    assert history["kl_to_teacher"][-1] < history["kl_to_teacher"][0]
    assert {
        "loss",
        "hard_loss",
        "soft_loss",
        "kl_to_teacher",
        "accuracy",
        "neg_log_perplexity",
    } <= set(history)
    for before, v in zip(teacher_before, teacher.weights, strict=False):
        np.testing.assert_array_equal(before, v.numpy(), err_msg=v.path)
    assert any(
        not np.array_equal(b, v.numpy())
        for b, v in zip(student_before, student.trainable_variables, strict=False)
    )


@pytest.mark.slow
def test_two_mirrored_replicas_train_as_one_device(rng, two_cpu_strategy):
    """The replicas hold different numbers of loss tokens (the padded rows are in
    the first half) and the student is sparse (aux and z losses): the logged
    loss terms and the update equal one device's."""
    import tensorflow as tf

    x, y, w = batch(rng, batch_size=8)
    assert w[:4].sum() != w[4:].sum()
    runs = []
    for strategy in (tf.distribute.get_strategy(), two_cpu_strategy):
        keras.utils.set_random_seed(3)
        with strategy.scope():
            # Per-sequence routing groups in both models: a "batch" group is per
            # replica by design, so 2 replicas would route the teacher differently.
            teacher = build_model(teacher_config(group_size="sequence"))
            student = build_model(teacher_config(group_size="sequence"))
            distiller = Distiller(teacher, student, alpha=0.5, temperature=2.0)
            distiller.compile(**distiller.compile_defaults(optimizer=keras.optimizers.SGD(0.5)))
        ds = tf.data.Dataset.from_tensors((x, y, w)).repeat(2)
        history = distiller.fit(ds, epochs=1, verbose=0, shuffle=False).history
        runs.append((history, [v.numpy() for v in student.trainable_variables]))
    (one, weights_one), (two, weights_two) = runs
    for key in ("loss", "hard_loss", "soft_loss", "kl_to_teacher", "neg_log_perplexity"):
        np.testing.assert_allclose(two[key], one[key], rtol=1e-5, err_msg=key)
    for a, b in zip(weights_one, weights_two, strict=False):
        np.testing.assert_allclose(b, a, rtol=1e-4, atol=1e-5)


def test_keras_round_trip(rng, tmp_path):
    teacher, student = _pair()
    x, _, _ = batch(rng)
    distiller = Distiller(teacher, student, alpha=0.3, temperature=1.5, scale_soft_loss=False)
    path = str(tmp_path / "distiller.keras")
    distiller.save(path)
    loaded = keras.saving.load_model(path)
    assert isinstance(loaded, Distiller)
    assert (loaded.alpha, loaded.temperature, loaded.scale_soft_loss) == (0.3, 1.5, False)
    assert not loaded.teacher.trainable
    np.testing.assert_allclose(np.asarray(loaded(x)), np.asarray(distiller(x)), atol=1e-6)
    np.testing.assert_allclose(
        np.asarray(loaded.teacher_logits(x)), np.asarray(distiller.teacher_logits(x)), atol=1e-6
    )


@pytest.mark.parametrize(
    "kwargs,name",
    [
        (dict(alpha=-0.1), "alpha"),
        (dict(alpha=1.5), "alpha"),
        (dict(temperature=0.0), "temperature"),
        (dict(temperature=-2.0), "temperature"),
        (dict(scale_soft_loss="yes"), "scale_soft_loss"),
    ],
)
def test_bad_arguments(kwargs, name):
    teacher, student = _pair()
    with pytest.raises(ValueError, match=name):
        Distiller(teacher, student, **kwargs)


def test_vocab_mismatch():
    teacher, _ = _pair()
    student = build_model(dense_student_config(teacher.config, vocab_size=41))
    with pytest.raises(ValueError, match="vocab_size"):
        Distiller(teacher, student)
    with pytest.raises(ValueError, match="teacher"):
        Distiller(keras.Sequential([keras.layers.Dense(2)]), student)
