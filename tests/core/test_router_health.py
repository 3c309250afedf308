"""Router health statistics and the init policy that keeps the experts learning."""

import keras
import numpy as np

import keras_moe
from keras_moe import routing
from keras_moe.routing import metrics


def test_load_imbalance_counts_requests_before_capacity():
    # 4 tokens, 3 prefer expert 0, 1 prefers expert 1; capacity 1 keeps 1 + 1.
    logits = np.array([[[3.0, 0.0], [2.0, 0.0], [1.0, 0.0], [0.0, 5.0]]], "float32")
    instructions = routing.SwitchRouter(num_experts=2).route(logits, np.ones((1, 4)), capacity=1)
    stats = metrics.router_metrics(instructions, np.ones((1, 4)))
    np.testing.assert_allclose(np.asarray(stats["expert_load"]), [0.75, 0.25])
    # max load 3/4 of the tokens with 2 experts: 1.5 (the kept load, 1/2 each, would say 1.0)
    assert float(stats["load_imbalance"]) == 1.5
    assert float(stats["dropped_fraction"]) == 0.5


def test_padding_is_left_out_of_the_load():
    logits = np.array([[[3.0, 0.0], [0.0, 3.0], [0.0, 3.0]]], "float32")
    mask = np.array([[1.0, 1.0, 0.0]])
    instructions = routing.SwitchRouter(num_experts=2).route(logits, mask, capacity=4)
    stats = metrics.router_metrics(instructions, mask)
    np.testing.assert_allclose(np.asarray(stats["expert_load"]), [0.5, 0.5])


def test_output_rms_ratio_against_numpy(rng):
    layer = keras_moe.SwitchFeedForward(num_experts=4, d_ff=16, return_metrics=True)
    x = rng.normal(size=(2, 6, 8)).astype("float32")
    mask = np.ones((2, 6), "float32")
    mask[1, 4:] = 0
    y, stats = layer(x, mask=mask)
    y = np.asarray(y, np.float64)
    real = mask > 0
    expected = np.sqrt(np.mean(y[real] ** 2) / np.mean(x[real].astype(np.float64) ** 2))
    np.testing.assert_allclose(float(stats["output_rms_ratio"]), expected, rtol=1e-4)


def _train_users_model(with_moe, steps=160):
    """A user's model: an input projection, a residual MoE branch, Keras' default Adam.

    Returns (final training loss, the MoE branch's output RMS / input RMS).
    """
    keras.utils.set_random_seed(0)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(512, 16, 32)).astype("float32")
    target = np.tanh(x @ rng.normal(size=(32, 32)).astype("float32") / 4.0) * 3.0
    inputs = keras.Input((16, 32))
    h = keras.layers.Dense(64)(inputs)
    moe = keras_moe.SwitchFeedForward(num_experts=4, d_ff=64, name="moe")
    mixed = keras.layers.Add()([h, moe(h)]) if with_moe else h
    model = keras.Model(inputs, keras.layers.Dense(32)(mixed))
    model.compile(keras.optimizers.Adam(), "mse")
    history = model.fit(x, target, batch_size=32, epochs=steps // 16, verbose=0)
    ratio = None
    if with_moe:
        probe = keras_moe.SwitchFeedForward.from_config(
            {**moe.get_config(), "return_metrics": True, "name": "probe"}
        )
        probe.build(h.shape)
        probe.set_weights(moe.get_weights())
        ratio = float(probe(keras.Model(inputs, h)(x[:64]))[1]["output_rms_ratio"])
    return history.history["loss"][-1], ratio


def test_moe_branch_learns_in_a_users_model_with_default_adam():
    """Dropped into a plain Keras model (batches of unknown size, default Adam), the
    branch speaks (its output is a sizeable part of the residual) and the model fits
    the nonlinear target better than the same model without it."""
    loss_moe, ratio = _train_users_model(True)
    loss_linear, _ = _train_users_model(False)
    assert ratio > 0.1
    assert loss_moe < 0.95 * loss_linear  # measured: 0.71 vs 0.79
