"""Routing each sequence apart is a property of a call, never a process-wide mode."""

import threading

import keras
import numpy as np

import keras_moe
from keras_moe.models import EncoderDecoder
from keras_moe.models.decoding import generate
from tests.models.helpers import tiny_switch_config


def _train_losses(x, y):
    """Three `fit` steps of a model whose batch-wide groups drop tokens (a new train function)."""
    keras.utils.set_random_seed(0)
    inputs = keras.Input((8, 16))
    moe = keras_moe.SwitchFeedForward(num_experts=4, d_ff=32, train_capacity_factor=0.5,
                                      min_expert_capacity=1, seed=0)
    model = keras.Model(inputs, keras.layers.Dense(1)(keras.layers.Add()([inputs, moe(inputs)])))
    model.compile(keras.optimizers.SGD(0.1), "mse")
    return model.fit(x, y, batch_size=4, epochs=3, shuffle=False, verbose=0).history["loss"]


def test_decoding_in_another_thread_leaves_a_training_trace_alone(rng):
    x = rng.normal(size=(4, 8, 16)).astype("float32")
    y = rng.normal(size=(4, 8, 1)).astype("float32")
    expected = _train_losses(x, y)
    with keras_moe.route_each_sequence():  # the per-sequence routing the server asks for
        per_sequence = _train_losses(x, y)
    assert not np.allclose(per_sequence, expected), "the grouping must change the losses"

    keras.utils.set_random_seed(1)
    server_model = EncoderDecoder(tiny_switch_config(vocab_size=8))
    decoding, trained = threading.Event(), threading.Event()
    original = server_model.init_cache

    def init_cache_and_wait(*args):  # hold the decoding open while the trainer traces
        decoding.set()
        assert trained.wait(timeout=300)
        return original(*args)

    server_model.init_cache = init_cache_and_wait
    server = threading.Thread(target=generate, args=(server_model, np.array([[5, 6, 1]])),
                              kwargs=dict(max_length=4, compiled=False))
    server.start()
    try:
        assert decoding.wait(timeout=300)
        during = _train_losses(x, y)
    finally:
        trained.set()
        server.join()
    np.testing.assert_allclose(during, expected, rtol=1e-6)


def test_a_call_argument_routes_each_sequence_apart(rng):
    layer = keras_moe.SwitchFeedForward(num_experts=4, d_ff=16, eval_capacity_factor=0.5,
                                        min_expert_capacity=1, seed=0)
    x = rng.normal(size=(3, 8, 8)).astype("float32")
    apart = np.asarray(layer(x, independent_routing=True))
    for row in range(3):
        np.testing.assert_allclose(apart[row:row + 1], np.asarray(layer(x[row:row + 1])),
                                   atol=1e-6)
    assert not np.allclose(np.asarray(layer(x)), apart, atol=1e-6)
    with keras_moe.route_each_sequence():  # the scope is the default, the argument wins
        np.testing.assert_allclose(np.asarray(layer(x)), apart, atol=1e-6)
        assert not np.allclose(np.asarray(layer(x, independent_routing=False)), apart, atol=1e-6)
