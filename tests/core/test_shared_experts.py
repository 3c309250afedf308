"""Shared experts beside routed ones, and the fine-grained top-k layer in T5 models and gin."""

import functools

import keras
import numpy as np
import pytest

import keras_moe
from keras_moe.gin_config import parse_gin
from keras_moe.models import T5Config, build_model
from keras_moe.models import sparse_ffn as sparse_ffn_lib

D = 8


def _silu(a):
    return a / (1.0 + np.exp(-a))


def _shared64(x, shared):
    """float64 gated-SiLU FFN times the sigmoid gate, from the layer's weights."""
    x = np.asarray(x, "float64")
    w = {v.name: np.asarray(v.numpy(), "float64") for v in shared.weights}
    hidden = _silu(x @ w["wi_0"]) * (x @ w["wi_1"])
    gate = 1.0 / (1.0 + np.exp(-(x @ w["gate_kernel"])))
    return gate * (hidden @ w["wo"])


@pytest.mark.parametrize("dispatch", ["gather", "dropless"])
def test_shared_expert_output_is_added_for_every_real_token(rng, dispatch):
    args = dict(
        num_experts=4,
        d_ff=4,
        k=2,
        activation="gated-silu",
        dispatch=dispatch,
        eval_capacity_factor=0.5,
        min_expert_capacity=1,
        track_metrics=False,
    )
    with_shared = keras_moe.TopKFeedForward(shared_d_ff=6, shared_expert_gate=True, **args)
    routed_only = keras_moe.TopKFeedForward(**args)
    x = rng.normal(size=(2, 5, D)).astype("float32")
    mask = np.array([[1, 1, 1, 1, 0], [1, 1, 1, 1, 1]], "float32")
    with_shared(x, mask=mask)
    routed_only(x)
    routed_only.router.set_weights(with_shared.router.get_weights())
    routed_only.experts.set_weights(with_shared.experts.get_weights())
    difference = np.asarray(with_shared(x, mask=mask)) - np.asarray(routed_only(x, mask=mask))
    expected = _shared64(x, with_shared.shared_experts) * mask[..., None]
    np.testing.assert_allclose(difference, expected, atol=1e-5)
    assert np.abs(expected[mask > 0]).max() > 1e-2  # the shared expert is not silent
    assert np.all(np.asarray(with_shared(x, mask=mask))[0, 4] == 0.0)  # padding stays 0


def test_shared_expert_with_a_moe_layer_round_trips(rng, tmp_path):
    layer = keras_moe.MoeLayer(
        keras_moe.TopKRouter(4, k=2),
        keras_moe.FeedForwardExperts(4, 8),
        shared_experts=keras_moe.SharedExpertFeedForward(6, activation="relu"),
        track_metrics=False,
    )
    inputs = keras.Input((5, D))
    model = keras.Model(inputs, layer(inputs))
    x = rng.normal(size=(2, 5, D)).astype("float32")
    path = str(tmp_path / "m.keras")
    model.save(path)
    loaded = keras.saving.load_model(path)
    np.testing.assert_allclose(loaded(x), model(x), atol=1e-6)
    assert loaded.layers[-1].shared_experts.d_ff == 6


@pytest.mark.slow
def test_fine_grained_t5_model_with_shared_expert_and_first_dense_layers(rng):
    spec = functools.partial(
        keras_moe.TopKFeedForward,
        num_experts=16,
        d_ff=8,
        k=4,
        shared_d_ff=8,
        selection_bias=True,
        bias_update_rate=1e-2,
        aux_loss_factor=0.0,
        activation="gated-gelu",
    )
    # The first layer of each stack dense (DeepSeek's first_k_dense_replace = 1).
    config = T5Config(
        vocab_size=32,
        d_model=D,
        num_heads=2,
        d_kv=4,
        d_ff=32,
        num_encoder_layers=3,
        num_decoder_layers=3,
        dropout_rate=0.0,
        encoder_sparse_layers=[1, 2],
        decoder_sparse_layers=[1, 2],
        sparse_ffn=spec,
    )
    model = build_model(config)
    x = {
        "encoder_input_tokens": rng.integers(1, 32, size=(2, 6)).astype("int32"),
        "decoder_input_tokens": rng.integers(1, 32, size=(2, 4)).astype("int32"),
    }
    y = rng.integers(1, 32, size=(2, 4)).astype("int32")
    model.compile(**model.compile_defaults(optimizer=keras.optimizers.Adam(1e-2)))
    model.fit(x, y, epochs=1, verbose=0)
    sparse = [layer for layer in model._flatten_layers() if isinstance(layer, keras_moe.MoeLayer)]
    assert len(sparse) == 4
    assert all(layer.shared_experts is not None for layer in sparse)
    assert any(np.any(layer.router.expert_bias.numpy() != 0) for layer in sparse)  # fit moved it
    expected = sum(sparse_ffn_lib.count_sparse_ffn_params(config.sparse_ffn, D) for _ in sparse)
    assert sum(layer.count_params() for layer in sparse) == expected


def test_gin_reaches_every_part_of_the_recipe():
    config = parse_gin(
        "tiny.gin",
        "\n".join(
            [
                "T5Config.sparse_ffn = @TopKFeedForward",
                "T5Config.encoder_sparse_step = 2",
                "T5Config.decoder_sparse_step = 2",
                "TopKFeedForward.num_experts = 8",
                "TopKFeedForward.d_ff = 16",
                "TopKFeedForward.k = 3",
                "TopKFeedForward.score_function = 'sigmoid'",
                "TopKFeedForward.normalize_top_k = True",
                "TopKFeedForward.n_group = 4",
                "TopKFeedForward.topk_group = 2",
                "TopKFeedForward.shared_d_ff = 16",
                "TopKFeedForward.shared_expert_gate = True",
                "TopKFeedForward.selection_bias = True",
                "TopKFeedForward.bias_update_rate = 1e-3",
                "TopKFeedForward.balance_loss = 'global'",
            ]
        ),
    )
    layer = config.make_sparse_ffn("encoder", name="ffn")
    router = layer.router
    assert (router.k, router.score_function, router.topk_group) == (3, "sigmoid", 2)
    assert layer.shared_experts.gate and layer.balance_loss == "global"
    assert layer.router.bias_update_rate == 1e-3
