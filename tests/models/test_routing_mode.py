"""Routing each sequence apart is a property of a call, never a process-wide mode."""

import threading

import keras
import numpy as np
import pytest

import keras_moe
from keras_moe.models import EncoderDecoder
from keras_moe.models.decoding import generate
from tests.models.helpers import tiny_switch_config


def _train_losses(x, y):
    """Three `fit` steps of a model whose batch-wide groups drop tokens (a new train function)."""
    keras.utils.set_random_seed(0)
    inputs = keras.Input((8, 16))
    moe = keras_moe.SwitchFeedForward(
        num_experts=4, d_ff=32, train_capacity_factor=0.5, min_expert_capacity=1, seed=0
    )
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
    server = threading.Thread(
        target=generate,
        args=(server_model, np.array([[5, 6, 1]])),
        kwargs=dict(max_length=4, compiled=False),
    )
    server.start()
    try:
        assert decoding.wait(timeout=300)
        during = _train_losses(x, y)
    finally:
        trained.set()
        server.join()
    np.testing.assert_allclose(during, expected, rtol=1e-6)


def test_a_call_argument_routes_each_sequence_apart(rng):
    layer = keras_moe.SwitchFeedForward(
        num_experts=4, d_ff=16, eval_capacity_factor=0.5, min_expert_capacity=1, seed=0
    )
    x = rng.normal(size=(3, 8, 8)).astype("float32")
    apart = np.asarray(layer(x, independent_routing=True))
    for row in range(3):
        np.testing.assert_allclose(
            apart[row : row + 1], np.asarray(layer(x[row : row + 1])), atol=1e-6
        )
    assert not np.allclose(np.asarray(layer(x)), apart, atol=1e-6)
    with keras_moe.route_each_sequence():  # the scope is the default, the argument wins
        np.testing.assert_allclose(np.asarray(layer(x)), apart, atol=1e-6)
        assert not np.allclose(np.asarray(layer(x, independent_routing=False)), apart, atol=1e-6)


def _pair(group_size="batch"):
    """An EncoderDecoder whose batch-wide routing groups drop tokens, and its twin with
    one routing group per sequence (`group_size="sequence"`): the reference of what
    routing each sequence apart must give."""
    models = []
    for size in ("batch", "sequence"):
        keras.utils.set_random_seed(2)
        model = EncoderDecoder(
            tiny_switch_config(
                vocab_size=16,
                train_capacity_factor=0.5,
                eval_capacity_factor=0.5,
                min_expert_capacity=1,
                group_size=size,
                track_router_metrics=False,
            )
        )
        model.compile(
            keras.optimizers.SGD(0.0),
            **{k: v for k, v in model.compile_defaults().items() if k != "optimizer"},
        )
        models.append(model)
    batch, sequence = models
    x = _tokens()
    batch(x), sequence(x)
    sequence.set_weights(batch.get_weights())
    return batch, sequence


def _tokens():
    tokens = np.random.default_rng(5).integers(2, 16, size=(4, 7)).astype("int32")
    return {
        "encoder_input_tokens": tokens,
        "decoder_input_tokens": tokens,
        "decoder_target_tokens": tokens,
    }


def _evaluate(model, x):
    return model.evaluate(x, batch_size=4, verbose=0, return_dict=True)["loss"]


def test_route_each_sequence_takes_effect_on_the_encoder_decoder():
    """call, encode, evaluate and fit inside the scope equal the per-sequence twin; outside
    it they do not (the capacity drops tokens differently). Functions Keras traced
    outside the scope are traced again inside it, and the other way round."""
    model, reference = _pair()
    x = _tokens()
    outside = {
        "call": np.asarray(model(x)),
        "evaluate": _evaluate(model, x),
        "fit": model.fit(x, batch_size=4, verbose=0).history["loss"][0],
    }
    expected = {
        "call": np.asarray(reference(x)),
        "encode": np.asarray(reference.encode(x["encoder_input_tokens"])[0]),
        "evaluate": _evaluate(reference, x),
        "fit": reference.fit(x, batch_size=4, verbose=0).history["loss"][0],
    }
    assert not np.allclose(outside["call"], expected["call"], atol=1e-5)
    assert not np.isclose(outside["evaluate"], expected["evaluate"], rtol=1e-6)
    assert not np.isclose(outside["fit"], expected["fit"], rtol=1e-6)
    with keras_moe.route_each_sequence():
        inside = {
            "call": np.asarray(model(x)),
            "encode": np.asarray(model.encode(x["encoder_input_tokens"])[0]),
            "evaluate": _evaluate(model, x),
            "fit": model.fit(x, batch_size=4, verbose=0).history["loss"][0],
        }
    for name, value in inside.items():
        np.testing.assert_allclose(value, expected[name], rtol=1e-5, atol=1e-6, err_msg=name)
    np.testing.assert_allclose(
        _evaluate(model, x), outside["evaluate"], rtol=1e-6
    )  # and back to batch-wide groups after it


def test_eval_routing_sequence_evaluates_the_same_on_one_device_and_on_two(two_cpu_strategy):
    """train.eval_routing: with "groups" the loss of one batch depends on how many
    replicas split it (each routes its share, at its capacity); with "sequence" it is
    the per-sequence twin's on one device and on two replicas."""
    model, reference = _pair()
    x = _tokens()
    with two_cpu_strategy.scope():
        keras.utils.set_random_seed(2)
        replicated = EncoderDecoder(model.config)
        replicated.compile(
            keras.optimizers.SGD(0.0),
            **{k: v for k, v in model.compile_defaults().items() if k != "optimizer"},
        )
    replicated(x)
    replicated.set_weights(model.get_weights())
    one = _evaluate(model, x)
    two = _evaluate(replicated, x)
    assert not np.isclose(one, two, rtol=1e-5), "the replicas' groups must change the loss"
    expected = _evaluate(reference, x)
    for evaluated in (model, replicated):
        evaluated.eval_routing = "sequence"
        np.testing.assert_allclose(_evaluate(evaluated, x), expected, rtol=1e-5)
    model.eval_routing = "everything"
    with pytest.raises(
        ValueError,
        match=r"`eval_routing` must be one of \('groups', "
        r"'sequence'\), got 'everything'",
    ):
        _evaluate(model, x)
