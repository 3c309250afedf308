"""Sparse upcycling (`keras_moe.models.upcycle`): a dense model's weights start a MoE model.

The references are the dense model itself (its logits, which the upcycled model
must reproduce where the recipe is exact) and NumPy slices of its FFN weights.
"""

import dataclasses

import numpy as np
import pytest

from keras_moe import SwitchFeedForward, TopKFeedForward
from keras_moe.models import EncoderDecoder, T5Config
from keras_moe.models.upcycle import upcycle_weights
from keras_moe.models.variable_paths import relative_paths

DENSE = T5Config(
    vocab_size=40,
    d_model=16,
    num_heads=2,
    d_kv=8,
    d_ff=32,
    num_encoder_layers=2,
    num_decoder_layers=2,
    activation="gated-gelu",
)


def _batch(seed=0):
    rng = np.random.default_rng(seed)
    return {
        "encoder_input_tokens": rng.integers(2, 40, (3, 10)).astype("int32"),
        "decoder_input_tokens": rng.integers(2, 40, (3, 7)).astype("int32"),
    }


def _pair(sparse_ffn, dense_config=DENSE, seed=0, **changes):
    import keras

    keras.utils.set_random_seed(seed)
    sparse_config = dataclasses.replace(
        dense_config, encoder_sparse_step=2, decoder_sparse_step=2, sparse_ffn=sparse_ffn
    )
    dense = EncoderDecoder(dataclasses.replace(dense_config, **changes))
    sparse = EncoderDecoder(sparse_config)
    dense(_batch()), sparse(_batch())
    return sparse, dense


def _logits(model, batch):
    return np.asarray(model(batch, training=False))


@pytest.mark.parametrize("k", [1, 2])
def test_experts_as_wide_as_the_ffn_with_gates_summing_to_one_start_at_the_dense_logits(k):
    # Enough capacity that no token is dropped; any router: every expert is the FFN.
    sparse, dense = _pair(
        TopKFeedForward(
            num_experts=4,
            d_ff=32,
            k=k,
            normalize_top_k=True,
            eval_capacity_factor=4.0,
            activation="gated-gelu",
        )
    )
    before = _logits(sparse, _batch(1))
    upcycle_weights(sparse, dense)
    want = _logits(dense, _batch(1))
    assert np.abs(before - want).max() > 1e-2  # the fresh model was elsewhere
    np.testing.assert_allclose(_logits(sparse, _batch(1)), want, atol=2e-5)


def test_granular_experts_with_a_zero_router_start_at_the_dense_logits():
    # 8 experts a quarter of d_ff wide, top-4: with uniform scores the first 4
    # experts hold the 4 slices, each at gate 1/4, and wo is scaled by 4.
    sparse, dense = _pair(
        TopKFeedForward(
            num_experts=8,
            d_ff=8,
            k=4,
            normalize_top_k=True,
            eval_capacity_factor=8.0,
            activation="gated-gelu",
        )
    )
    upcycle_weights(sparse, dense, router_init="zero")
    np.testing.assert_allclose(_logits(sparse, _batch(2)), _logits(dense, _batch(2)), atol=2e-5)


def test_granular_experts_with_a_replicated_router_start_at_the_dense_logits_and_spread():
    # 16 experts a quarter of d_ff wide, top-4: 4 copies of the FFN; a token's
    # router picks the 4 slices of one copy, and the copies share the tokens.
    sparse, dense = _pair(
        TopKFeedForward(
            num_experts=16,
            d_ff=8,
            k=4,
            normalize_top_k=True,
            eval_capacity_factor=16.0,
            activation="gated-gelu",
            router_init_scale=10.0,
        )
    )
    upcycle_weights(sparse, dense, router_init="replicated")
    np.testing.assert_allclose(_logits(sparse, _batch(4)), _logits(dense, _batch(4)), atol=2e-5)
    kernel = relative_paths(sparse)["encoder_layer_1/ffn/router/kernel"].numpy()
    np.testing.assert_array_equal(kernel[:, 4:8], np.repeat(kernel[:, 4:5], 4, axis=1))
    x = np.random.default_rng(5).normal(size=(4, 16, 16)).astype("float32")
    chosen = np.argmax(x @ kernel, axis=-1) // 4  # the copy each token goes to
    assert len(np.unique(chosen)) > 1


def test_a_switch_router_starts_at_the_dense_ffn_times_its_gate():
    # Switch multiplies the expert output by the softmax probability: with a zero
    # router over 4 experts that is 1/4 of the dense FFN at the MoE layer.
    sparse, dense = _pair(
        SwitchFeedForward(num_experts=4, d_ff=32, eval_capacity_factor=4.0, activation="gated-gelu")
    )
    upcycle_weights(sparse, dense, router_init="zero")
    x = np.random.default_rng(3).normal(size=(2, 5, 16)).astype("float32")
    moe = sparse.encoder_layers[1].ffn
    ffn = dense.encoder_layers[1].ffn
    np.testing.assert_allclose(
        np.asarray(moe(x, training=False)), np.asarray(ffn(x, training=False)) / 4, atol=1e-6
    )


def test_each_granular_expert_holds_its_slice_of_d_ff_and_wo_is_scaled():
    sparse, dense = _pair(
        TopKFeedForward(num_experts=8, d_ff=8, k=4, normalize_top_k=True, activation="gated-gelu")
    )
    report = upcycle_weights(sparse, dense)
    src, dst = relative_paths(dense), relative_paths(sparse)
    wi_0 = src["decoder_layer_1/ffn/wi_0"].numpy()
    wo = src["decoder_layer_1/ffn/wo"].numpy()
    for expert, part in ((0, 0), (5, 1), (7, 3)):
        np.testing.assert_array_equal(
            dst["decoder_layer_1/ffn/experts/wi_0"].numpy()[expert],
            wi_0[:, 8 * part : 8 * part + 8],
        )
        np.testing.assert_allclose(
            dst["decoder_layer_1/ffn/experts/wo"].numpy()[expert],
            4 * wo[8 * part : 8 * part + 8],
            rtol=1e-6,
        )
    assert sorted(report["routers"]) == [
        "decoder_layer_1/ffn/router/kernel",
        "encoder_layer_1/ffn/router/kernel",
    ]
    assert len(report["experts"]) == 6 and report["fresh"] == []
    np.testing.assert_array_equal(
        dst["encoder_layer_0/attention/query"].numpy(),
        src["encoder_layer_0/attention/query"].numpy(),
    )
    assert "token_embedding/embeddings" in report["copied"]


def test_router_init_fresh_keeps_the_router_and_zero_zeroes_it():
    sparse, dense = _pair(
        TopKFeedForward(num_experts=4, d_ff=32, k=1, normalize_top_k=True, activation="gated-gelu")
    )
    router = relative_paths(sparse)["encoder_layer_1/ffn/router/kernel"]
    fresh = router.numpy().copy()
    upcycle_weights(sparse, dense)
    np.testing.assert_array_equal(router.numpy(), fresh)
    assert np.abs(fresh).max() > 0
    upcycle_weights(sparse, dense, router_init="zero")
    assert not router.numpy().any()


def test_noise_makes_the_experts_differ_by_about_noise_std():
    sparse, dense = _pair(
        TopKFeedForward(num_experts=4, d_ff=32, k=1, normalize_top_k=True, activation="gated-gelu")
    )
    upcycle_weights(sparse, dense, noise_std=0.01, seed=0)
    experts = relative_paths(sparse)["encoder_layer_1/ffn/experts/wi_1"].numpy()
    ffn = relative_paths(dense)["encoder_layer_1/ffn/wi_1"].numpy()
    relative = experts / ffn - 1
    assert not np.allclose(experts[0], experts[1])
    assert 0.008 < relative.std() < 0.012 and abs(relative.mean()) < 0.002


def test_a_shared_expert_has_no_dense_source_and_stays_fresh():
    sparse, dense = _pair(
        TopKFeedForward(
            num_experts=4,
            d_ff=32,
            k=1,
            normalize_top_k=True,
            shared_d_ff=16,
            activation="gated-gelu",
        )
    )
    report = upcycle_weights(sparse, dense)
    assert report["fresh"] and all("/ffn/shared" in p for p in report["fresh"]), report["fresh"]


@pytest.mark.parametrize(
    "expert_d_ff, changes, match",
    [
        (
            8,
            {"d_model": 24},
            r"weight 'token_embedding/embeddings' has shape \(40, 16\) in the "
            r"sparse model but \(40, 24\) in the dense model",
        ),
        (
            8,
            {"num_encoder_layers": 3},
            "dense weight 'encoder_layer_2/attention/key' has no place in the sparse model",
        ),
        (
            8,
            {"d_ff": 36},
            r"weight 'encoder_layer_0/ffn/wi_0' has shape \(16, 32\) in the sparse "
            r"model but \(16, 36\)",
        ),
        (
            12,
            {},
            r"'encoder_layer_1/ffn/experts/wi_0' has shape \(4, 16, 12\); from a dense weight "
            r"of shape \(16, 32\) each expert must be as wide as d_ff=32 or a whole fraction",
        ),
    ],
)
def test_a_dense_model_that_does_not_match_is_refused_naming_the_weight(
    expert_d_ff, changes, match
):
    sparse, dense = _pair(
        TopKFeedForward(
            num_experts=4, d_ff=expert_d_ff, k=4, normalize_top_k=True, activation="gated-gelu"
        ),
        **changes,
    )
    with pytest.raises(ValueError, match=match):
        upcycle_weights(sparse, dense)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (
            {"router_init": "random"},
            r"`router_init` must be one of \('fresh', 'zero', 'replicated'\)",
        ),
        ({"noise_std": -0.1}, "`noise_std` must be a number >= 0, got -0.1"),
        ({"noise_std": float("nan")}, "`noise_std` must be a number >= 0"),
    ],
)
def test_bad_arguments_are_refused(kwargs, match):
    sparse, dense = _pair(TopKFeedForward(num_experts=4, d_ff=32, k=1, activation="gated-gelu"))
    with pytest.raises(ValueError, match=match):
        upcycle_weights(sparse, dense, **kwargs)


def test_an_moe_model_given_as_the_dense_source_or_a_dense_target_is_refused():
    """An MoE 'dense' source of the same shape would be copied weight for weight without
    a word (the training CLI refuses it); a dense 'sparse' target likewise."""
    ffn = TopKFeedForward(num_experts=4, d_ff=32, k=1, activation="gated-gelu")
    sparse, dense = _pair(ffn)
    other_sparse, _ = _pair(ffn, seed=1)
    before = [v.numpy().copy() for v in sparse.weights]
    with pytest.raises(
        ValueError,
        match=r"`dense` EncoderDecoder has MoE layers "
        r"\((en|de)coder_layer_1/ffn \.\.\.\): upcycling",
    ):
        upcycle_weights(sparse, other_sparse)
    assert all(np.array_equal(a, v.numpy()) for a, v in zip(before, sparse.weights, strict=True))
    with pytest.raises(ValueError, match=r"`sparse` EncoderDecoder has no MoE layer"):
        upcycle_weights(dense, dense)
