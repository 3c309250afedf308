"""keras_moe's Adafactor against a float64 NumPy Adafactor, Keras' own, and a sparse gradient."""

import keras
import numpy as np
import pytest

from keras_moe.models.adafactor import Adafactor
from keras_moe.models.seq2seq_objective import compile_defaults
from keras_moe.training.run.schedules import make_optimizer


def reference_adafactor(
    weights,
    gradients,
    learning_rate,
    decay_rate=-0.8,
    epsilon_1=1e-30,
    epsilon_2=1e-3,
    clip_threshold=1.0,
):
    """Adafactor (Shazeer & Stern 2018, Algorithm 4 with update clipping and relative
    step size) in float64, one gradient per step; returns the weights after each step."""
    x = np.asarray(weights, np.float64)
    factored = x.ndim >= 2
    r = np.zeros(x.shape[:-1])
    c = np.zeros(x.shape[:-2] + x.shape[-1:])
    v = np.zeros(x.shape)
    out = []
    for t, g in enumerate(gradients, start=1):
        g = np.asarray(g, np.float64)
        rho = min(learning_rate, 1 / np.sqrt(t))
        alpha = max(epsilon_2, np.sqrt(np.mean(x**2))) * rho
        beta = 1 - t**decay_rate
        squared = g**2 + epsilon_1
        if factored:
            r = beta * r + (1 - beta) * squared.mean(-1)
            c = beta * c + (1 - beta) * squared.mean(-2)
            v = (r / r.mean(-1, keepdims=True))[..., None] * c[..., None, :]
        else:
            v = beta * v + (1 - beta) * squared
        u = g / np.sqrt(v)
        u = u / max(1.0, np.sqrt(np.mean(u**2)) / clip_threshold)
        x = x - alpha * u
        out.append(x.copy())
    return out


def steps(optimizer, weights, gradients):
    variable = keras.Variable(np.asarray(weights, np.float32))
    out = []
    for g in gradients:
        optimizer.apply([g], [variable])
        out.append(keras.ops.convert_to_numpy(variable).astype(np.float64))
    return out


def dead_unit_gradients(shape, count, seed=0):
    """Gradients whose row 1 is exactly zero (a unit no token activated) while one
    column is tiny: Keras' factored estimate underflows to 0 there."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(count):
        g = rng.normal(size=shape).astype(np.float32) * 0.1
        if len(shape) == 1:
            g[1] = 0.0
        else:
            g[..., 1, :] = 0.0
        g[..., -1] *= 1e-8
        out.append(g)
    return out


@pytest.mark.parametrize("shape", [(5,), (4, 6), (3, 4, 6)])
def test_matches_float64_reference_where_keras_adafactor_turns_nan(shape):
    rng = np.random.default_rng(1)
    weights = rng.normal(size=shape)
    gradients = dead_unit_gradients(shape, 3)
    expected = reference_adafactor(weights, gradients, learning_rate=0.01)
    got = steps(Adafactor(learning_rate=0.01), weights, gradients)
    for step, (a, b) in enumerate(zip(got, expected, strict=True)):
        assert np.isfinite(a).all(), f"step {step + 1}"
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6, err_msg=f"step {step + 1}")


def test_equals_keras_adafactor_on_well_conditioned_gradients():
    """Same hyperparameters and update as Keras' where Keras' is finite: a checkpoint
    trained with either continues the same way."""
    rng = np.random.default_rng(2)
    weights = rng.normal(size=(3, 4, 6))
    gradients = [rng.normal(size=(3, 4, 6)).astype(np.float32) for _ in range(3)]
    kwargs = dict(learning_rate=0.02, beta_2_decay=-0.7, clip_threshold=0.5)
    ours = steps(Adafactor(**kwargs), weights, gradients)
    theirs = steps(keras.optimizers.Adafactor(**kwargs), weights, gradients)
    for a, b in zip(ours, theirs, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)


def test_a_sparse_gradient_with_repeated_indices_updates_as_its_dense_sum():
    if keras.backend.backend() != "tensorflow":
        pytest.skip("IndexedSlices gradients are TensorFlow's")
    import tensorflow as tf

    rng = np.random.default_rng(3)
    weights = rng.normal(size=(6, 4))
    values = rng.normal(size=(7, 4)).astype(np.float32)
    indices = [0, 0, 1, 3, 3, 3, 1]  # rows 2, 4, 5 get no gradient
    sparse = tf.IndexedSlices(tf.constant(values), tf.constant(indices), tf.constant([6, 4]))
    dense = np.zeros((6, 4), np.float32)
    np.add.at(dense, indices, values)
    got = steps(Adafactor(learning_rate=0.01), weights, [sparse])
    expected = reference_adafactor(weights, [dense], learning_rate=0.01)
    np.testing.assert_allclose(got[0], expected[0], rtol=1e-5, atol=1e-6)


def test_the_training_and_notebook_defaults_use_it():
    """make_optimizer("adafactor") (gin runs) and compile_defaults (notebooks) stay finite
    on the gradient that turns Keras' Adafactor to NaN."""
    gradient = dead_unit_gradients((4, 6), 1)[0]
    for optimizer in (
        make_optimizer("adafactor", learning_rate=0.01, schedule="constant"),
        compile_defaults(learning_rate=0.01)["optimizer"],
    ):
        (weights,) = steps(optimizer, np.ones((4, 6)), [gradient])
        assert np.isfinite(weights).all(), type(optimizer)


def test_round_trips_through_keras_serialization():
    optimizer = Adafactor(learning_rate=0.05, clip_threshold=2.0)
    restored = keras.saving.deserialize_keras_object(keras.saving.serialize_keras_object(optimizer))
    assert type(restored) is Adafactor
    assert restored.clip_threshold == 2.0 and float(restored.learning_rate) == pytest.approx(0.05)
