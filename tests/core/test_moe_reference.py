"""MoeLayer against an independent float64 NumPy reference, for every router and dispatcher."""

import math

import numpy as np
import pytest

import keras_moe
from keras_moe import routing
from keras_moe.layers import experts as experts_lib
from tests.core.reference import reference_moe


def _weights(layer):
    w = {"router": np.asarray(layer.router.kernel.numpy())}
    for v in layer.experts.weights:
        w[v.name] = np.asarray(v.numpy())
    return w


def _layer(k, num_experts, d_ff, dispatch, activation="relu", normalize=False, **kwargs):
    if k == 1:
        router = routing.SwitchRouter(num_experts, seed=0)
    else:
        router = routing.TopKRouter(num_experts, k=k, normalize_top_k=normalize, seed=0)
    ffn = experts_lib.FeedForwardExperts(num_experts, d_ff, activation=activation, init_scale=1.0)
    return keras_moe.MoeLayer(router, ffn, dispatch=dispatch, **kwargs)


@pytest.mark.parametrize("dispatch", ["einsum", "gather"])
@pytest.mark.parametrize(
    "k,capacity_factor,activation,normalize",
    [
        (1, 0.5, "relu", False),
        (1, 4.0, "gated-gelu", False),
        (2, 0.75, "relu", True),
        (3, 1.0, "gelu", False),
    ],
)
@pytest.mark.parametrize("grouping", ["sequence", "batch"])
def test_layer_matches_float64_reference(
    rng, dispatch, k, capacity_factor, activation, normalize, grouping
):
    batch, length, d_model, num_experts = 3, 12, 8, 4
    layer = _layer(
        k,
        num_experts,
        16,
        dispatch,
        activation,
        normalize,
        eval_capacity_factor=capacity_factor,
        min_expert_capacity=0,
        group_size=grouping,
    )
    x = rng.normal(size=(batch, length, d_model)).astype("float32")
    mask = np.ones((batch, length), "float32")
    mask[1, 9:] = 0
    mask[2, :3] = 0
    y = np.asarray(layer(x, mask=mask, training=False))

    def capacity(real_tokens):  # Switch / GShard: ceil(cf * k * tokens / E), of real tokens
        return min(real_tokens, math.ceil(capacity_factor * k * real_tokens / num_experts))

    expected, counts, aux, z = reference_moe(
        x,
        mask,
        _weights(layer),
        k,
        capacity,
        activation,
        normalize,
        group_size=None if grouping == "sequence" else grouping,
    )
    np.testing.assert_allclose(y, expected, rtol=2e-4, atol=2e-5)
    real_per_group = mask.sum(1) if grouping == "sequence" else [mask.sum()]
    assert all(counts[g].max() <= capacity(int(n)) for g, n in enumerate(real_per_group))
    losses = [float(v) for v in layer.losses]
    np.testing.assert_allclose(losses, [1e-2 * aux, 1e-3 * z], rtol=1e-4)
    if k == 1 and capacity_factor < 1:  # some tokens dropped: their output is exactly 0
        dropped = (np.abs(expected).sum(-1) == 0) & (mask > 0)
        assert dropped.any()
        assert np.all(y[dropped] == 0)
    assert np.all(y[mask == 0] == 0)


@pytest.mark.parametrize("dispatch", ["einsum", "gather"])
def test_group_size_flattens_tokens_into_groups(rng, dispatch):
    layer = _layer(
        1, 4, 16, dispatch, group_size=8, eval_capacity_factor=1.0, min_expert_capacity=0
    )
    x = rng.normal(size=(4, 6, 8)).astype("float32")  # 24 tokens -> 3 groups of 8
    mask = np.ones((4, 6), "float32")
    y = np.asarray(layer(x, mask=mask))
    expected, _, aux, z = reference_moe(
        x, mask, _weights(layer), 1, layer.capacity(8, False), group_size=8
    )
    np.testing.assert_allclose(y, expected, rtol=2e-4, atol=2e-5)
    np.testing.assert_allclose(float(layer.losses[0]), 1e-2 * aux, rtol=1e-4)


def test_group_size_not_dividing_tokens_is_an_error_unless_padding(rng):
    x = rng.normal(size=(2, 5, 8)).astype("float32")
    layer = _layer(1, 4, 16, "gather", group_size=4)
    with pytest.raises(ValueError, match="group_size"):
        layer(x)
    padded = _layer(
        1, 4, 16, "gather", group_size=4, pad_to_group_size=True, eval_capacity_factor=100.0
    )
    y = np.asarray(padded(x))
    expected, _, _, _ = reference_moe(
        np.concatenate([x.reshape(-1, 8), np.zeros((2, 8))]).reshape(3, 4, 8),
        np.concatenate([np.ones(10), np.zeros(2)]).reshape(3, 4),
        _weights(padded),
        1,
        padded.capacity(4, False),
    )
    np.testing.assert_allclose(y.reshape(-1, 8), expected.reshape(-1, 8)[:10], rtol=2e-4, atol=2e-5)
