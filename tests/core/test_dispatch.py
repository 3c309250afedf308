"""The einsum and gather dispatchers give the same numbers, forward and backward."""

import numpy as np
import pytest

import keras_moe
from keras_moe import dispatch as dispatch_lib
from tests.core.helpers import (
    assert_same_outputs_and_gradients,
    forward_and_gradients,
    inputs_and_mask,
    with_same_weights,
)


def _pair(layer_cls, seed, **kwargs):
    a = layer_cls(num_experts=6, d_ff=24, dispatch="einsum", seed=seed, **kwargs)
    b = layer_cls(num_experts=6, d_ff=24, dispatch="gather", seed=seed, **kwargs)
    return a, b


@pytest.mark.parametrize(
    "layer_cls,kwargs",
    [
        (keras_moe.SwitchFeedForward, dict(eval_capacity_factor=0.8, min_expert_capacity=0)),
        (keras_moe.SwitchFeedForward, dict(eval_capacity_factor=1.0, group_size=10)),
        (keras_moe.GShardFeedForward, dict(eval_capacity_factor=0.6, activation="gated-gelu")),
    ],
)
def test_einsum_and_gather_agree_forward_and_gradients(rng, layer_cls, kwargs):
    a, b = _pair(layer_cls, 7, **kwargs)
    x, mask = inputs_and_mask(rng)
    with_same_weights(a, b, x.shape)
    results = [forward_and_gradients(layer, x, mask) for layer in (a, b)]
    assert_same_outputs_and_gradients(*results)
    assert np.abs(results[0][1][1]).sum() > 0  # the router does get a gradient


def test_expert_choice_dispatchers_agree(rng):
    layers = [
        keras_moe.MoeLayer(
            keras_moe.ExpertChoiceRouter(4, seed=0),
            keras_moe.FeedForwardExperts(4, 16),
            dispatch=mode,
        )
        for mode in ("einsum", "gather")
    ]
    x = rng.normal(size=(2, 8, 8)).astype("float32")
    for layer in layers:
        layer.build(x.shape)
    layers[1].set_weights(layers[0].get_weights())
    ya, yb = (np.asarray(layer(x)) for layer in layers)
    np.testing.assert_allclose(ya, yb, rtol=1e-5, atol=1e-6)


def test_expert_buffers_hold_the_right_tokens(rng):
    layer = keras_moe.SwitchFeedForward(num_experts=3, d_ff=8, dispatch="gather")
    x = rng.normal(size=(2, 5, 4)).astype("float32")
    layer.build(x.shape)
    logits = layer.router(x)
    routing = layer.router.route(logits, np.ones((2, 5)), capacity=5)
    for dispatcher in (dispatch_lib.EinsumDispatcher(), dispatch_lib.GatherDispatcher()):
        buffers = np.asarray(dispatcher.dispatch(x, dispatcher.plan(routing)))
        expert = np.asarray(routing.expert_index)[..., 0]
        position = np.asarray(routing.position)[..., 0]
        for g in range(2):
            for s in range(5):
                np.testing.assert_allclose(buffers[expert[g, s], g, position[g, s]], x[g, s])
        filled = np.zeros((3, 2, 5), bool)
        filled[expert, np.arange(2)[:, None], position] = True
        assert np.all(buffers[~filled] == 0)  # empty slots hold zeros


def test_unknown_dispatch_mode():
    with pytest.raises(ValueError, match="dispatch"):
        dispatch_lib.get_dispatcher("scatter")
    assert dispatch_lib.get_dispatcher("auto").name == "gather"  # CPU
