"""dispatch="dropless": no capacity, nothing dropped, each expert computes exactly its tokens."""

import functools

import numpy as np
import pytest
import tensorflow as tf

import keras_moe
from keras_moe import dispatch as dispatch_lib
from keras_moe import routing
from keras_moe.dispatch.grouped_matmul import grouped_matmul
from keras_moe.layers import experts as experts_lib
from tests.core.helpers import (
    assert_same_outputs_and_gradients,
    forward_and_gradients,
    inputs_and_mask,
    with_same_weights,
)
from tests.core.reference import reference_moe

NO_LIMIT = 10**9  # a capacity no expert reaches


def _layer(k, dispatch, num_experts=5, activation="relu", normalize=False, **kwargs):
    if k == 1:
        router = routing.SwitchRouter(num_experts, seed=0)
    else:
        router = routing.TopKRouter(num_experts, k=k, normalize_top_k=normalize, seed=0)
    ffn = experts_lib.FeedForwardExperts(num_experts, 16, activation=activation, init_scale=1.0)
    return keras_moe.MoeLayer(router, ffn, dispatch=dispatch, **kwargs)


def test_grouped_matmul_against_numpy(rng):
    x = rng.normal(size=(11, 4)).astype("float32")
    w = rng.normal(size=(3, 4, 5)).astype("float32")
    sizes = np.array([4, 0, 5])  # an empty group; 2 rows past the groups
    y = np.asarray(grouped_matmul(x, w, sizes))
    expected = np.concatenate([x[:4] @ w[0], x[4:9] @ w[2], np.zeros((2, 5))])
    np.testing.assert_allclose(y, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    "k,activation,normalize", [(1, "relu", False), (2, "gated-gelu", True), (3, "gelu", False)]
)
@pytest.mark.parametrize("grouping", ["sequence", "batch"])
def test_matches_the_float64_reference_without_capacity(rng, k, activation, normalize, grouping):
    # A capacity factor that would drop many tokens: dropless ignores it.
    layer = _layer(
        k,
        "dropless",
        activation=activation,
        normalize=normalize,
        group_size=grouping,
        eval_capacity_factor=0.25,
        min_expert_capacity=0,
    )
    x = rng.normal(size=(3, 10, 8)).astype("float32")
    mask = (rng.random((3, 10)) > 0.2).astype("float32")
    y = np.asarray(layer(x, mask=mask))
    weights = {"router": np.asarray(layer.router.kernel.numpy())}
    weights.update({v.name: np.asarray(v.numpy()) for v in layer.experts.weights})
    expected, _, aux, z = reference_moe(
        x,
        mask,
        weights,
        k,
        NO_LIMIT,
        activation,
        normalize,
        group_size=None if grouping == "sequence" else grouping,
    )
    np.testing.assert_allclose(y, expected, rtol=2e-4, atol=2e-5)
    np.testing.assert_allclose([float(v) for v in layer.losses], [1e-2 * aux, 1e-3 * z], rtol=1e-4)
    assert np.all(y[mask == 0] == 0)  # padding is never routed
    assert np.all(np.abs(y[mask > 0]).sum(-1) > 0)  # and no real token is dropped


@pytest.mark.parametrize(
    "layer_cls,kwargs",
    [
        (keras_moe.SwitchFeedForward, dict(activation="relu")),
        (keras_moe.GShardFeedForward, dict(activation="gated-gelu")),
    ],
)
def test_equals_gather_with_room_for_every_token_forward_and_gradients(rng, layer_cls, kwargs):
    """Gather at capacity factor E (room for all) vs dropless: outputs, losses, router
    metrics and the gradients of the input and every weight."""
    a = layer_cls(
        num_experts=6,
        d_ff=24,
        dispatch="gather",
        eval_capacity_factor=6.0,
        seed=3,
        return_metrics=True,
        **kwargs,
    )
    b = layer_cls(
        num_experts=6, d_ff=24, dispatch="dropless", seed=3, return_metrics=True, **kwargs
    )
    x, mask = inputs_and_mask(rng)
    with_same_weights(a, b, x.shape)
    results = [forward_and_gradients(layer, x, mask) for layer in (a, b)]
    assert_same_outputs_and_gradients(*results)
    (_, sa), gb, (_, sb) = results[0][0], results[1][1], results[1][0]
    assert np.abs(gb[1]).sum() > 0  # the router gets a gradient
    assert sa.keys() == sb.keys()
    for key in sa:
        np.testing.assert_allclose(sa[key], sb[key], rtol=1e-5, atol=1e-6, err_msg=key)
    assert float(sb["dropped_fraction"]) == 0.0


def test_training_step_learns_and_keras_file_round_trips(rng, tmp_path):
    import keras

    inputs = keras.Input((8, 16))
    outputs = keras.layers.Dense(4)(
        keras_moe.SwitchFeedForward(num_experts=4, d_ff=32, dispatch="dropless", seed=0)(inputs)
    )
    model = keras.Model(inputs, outputs)
    model.compile(optimizer=keras.optimizers.Adam(1e-2), loss="mse")
    x = rng.normal(size=(32, 8, 16)).astype("float32")
    y = np.tanh(x[..., :4])
    first = model.evaluate(x, y, verbose=0, return_dict=True)["loss"]
    model.fit(x, y, epochs=5, batch_size=8, verbose=0)
    assert model.evaluate(x, y, verbose=0, return_dict=True)["loss"] < 0.8 * first
    path = str(tmp_path / "dropless.keras")
    model.save(path)
    loaded = keras.saving.load_model(path, safe_mode=True)
    assert loaded.layers[1].dispatch == "dropless"
    np.testing.assert_allclose(
        loaded.predict(x, verbose=0), model.predict(x, verbose=0), rtol=1e-5, atol=1e-6
    )


def test_xla_is_refused_with_the_alternative(rng):
    layer = keras_moe.SwitchFeedForward(num_experts=4, d_ff=8, dispatch="dropless")
    x = rng.normal(size=(2, 4, 8)).astype("float32")
    with pytest.raises(ValueError, match="jit_compile=True.*dispatch='gather'"):
        tf.function(lambda t: layer(t), jit_compile=True)(x)


def test_refusals_name_what_to_use(monkeypatch):
    with pytest.raises(ValueError, match="token-choice router.*ExpertChoiceRouter"):
        keras_moe.MoeLayer(
            keras_moe.ExpertChoiceRouter(4), keras_moe.FeedForwardExperts(4, 8), dispatch="dropless"
        )
    from keras_moe.layers.expert_parallel import ExpertParallelExperts

    with pytest.raises(ValueError, match="sorted by expert.*ExpertParallelExperts.*'gather'"):
        keras_moe.MoeLayer(
            keras_moe.SwitchRouter(4), ExpertParallelExperts(4, 8), dispatch="dropless"
        )
    monkeypatch.setattr(dispatch_lib.sharding, "accelerator_platform", lambda: "tpu")
    with pytest.raises(ValueError, match="dropless.*TPU.*einsum"):
        dispatch_lib.get_dispatcher("dropless")
    from keras_moe.models import T5Config

    with pytest.raises(ValueError, match="`dispatch` must be one of"):
        T5Config(
            encoder_sparse_step=1,
            sparse_ffn=functools.partial(
                keras_moe.SwitchFeedForward, num_experts=2, d_ff=8, dispatch="sorted"
            ),
        )


def test_t5_model_with_dropless_layers_equals_gather_with_room_for_all(rng):
    from keras_moe.models import T5Config, build_model

    def config(**layer_args):
        return T5Config(
            vocab_size=32,
            d_model=16,
            num_heads=2,
            d_kv=8,
            d_ff=32,
            num_encoder_layers=2,
            num_decoder_layers=2,
            encoder_sparse_step=2,
            decoder_sparse_step=2,
            sparse_ffn=functools.partial(
                keras_moe.GShardFeedForward,
                num_experts=4,
                d_ff=32,
                activation="gated-gelu",
                **layer_args,
            ),
        )

    gather = build_model(config(dispatch="gather", eval_capacity_factor=4.0))
    dropless = build_model(config(dispatch="dropless"))
    batch = {
        "encoder_input_tokens": rng.integers(2, 32, (2, 12)),
        "decoder_input_tokens": rng.integers(2, 32, (2, 6)),
    }
    gather(batch)
    dropless(batch)
    dropless.set_weights(gather.get_weights())
    np.testing.assert_allclose(
        np.asarray(dropless(batch)), np.asarray(gather(batch)), rtol=1e-4, atol=1e-5
    )


def test_auto_never_picks_dropless_and_dropless_does_not_warn():
    from tests.core.helpers import check_dropless_choice

    check_dropless_choice()  # JAX: tests/core/jax_backend_checks
