"""The layers in user models: Sequential, functional, subclassed, masks, precision, saving."""

import os

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_moe


def _data(rng, n=16, length=8, d=16):
    x = rng.normal(size=(n, length, d)).astype("float32")
    y = np.tanh(x.sum(-1, keepdims=True)).astype("float32")
    return x, y


def test_sequential_model_trains_and_reports_router_metrics(rng):
    x, y = _data(rng)
    model = keras.Sequential(
        [
            keras.Input((8, 16)),
            keras_moe.SwitchFeedForward(num_experts=4, d_ff=32, name="moe"),
            keras.layers.Dense(1),
        ]
    )
    model.compile(keras.optimizers.Adam(1e-2), "mse")
    history = model.fit(x, y, epochs=3, batch_size=8, verbose=0).history
    assert history["loss"][-1] < history["loss"][0]
    for name in ("dropped_fraction", "router_entropy", "aux_loss", "z_loss", "load_imbalance"):
        values = history[f"moe/{name}"]
        assert len(values) == 3 and np.all(np.isfinite(values))
    assert 0.0 <= history["moe/dropped_fraction"][-1] <= 1.0
    assert 1.0 <= history["moe/load_imbalance"][-1] <= 4.0
    assert len(model.losses) == 2  # aux + z reach the training loss


def test_functional_residual_model_with_keras_mask(rng):
    tokens = rng.integers(1, 50, size=(6, 10))
    tokens[:, 7:] = 0  # padding
    inputs = keras.Input((10,), dtype="int32")
    h = keras.layers.Embedding(50, 16, mask_zero=True)(inputs)
    moe = keras_moe.GShardFeedForward(num_experts=4, d_ff=32, name="moe", return_metrics=True)
    branch, stats = moe(h)
    out = keras.layers.Add()([h, branch])
    model = keras.Model(inputs, [out, stats["dropped_fraction"]])
    outputs, dropped = model(tokens, training=False)
    branch_only = keras.Model(inputs, branch)(tokens)
    np.testing.assert_array_equal(np.asarray(branch_only)[:, 7:], 0.0)  # padding output 0
    assert 0.0 <= float(dropped) <= 1.0


class ResidualModel(keras.Model):
    def __init__(self):
        super().__init__()
        self.moe = keras_moe.SwitchFeedForward(num_experts=4, d_ff=32)
        self.head = keras.layers.Dense(1)

    def call(self, x, training=None):
        return self.head(x + self.moe(x, training=training))


def test_subclassed_model_trains(rng):
    x, y = _data(rng)
    model = ResidualModel()
    model.compile(keras.optimizers.Adam(1e-2), "mse")
    history = model.fit(x, y, epochs=3, batch_size=8, verbose=0).history
    assert history["loss"][-1] < history["loss"][0]


def test_mixed_bfloat16_keeps_the_router_in_float32(rng):
    keras.mixed_precision.set_global_policy("mixed_bfloat16")
    layer = keras_moe.SwitchFeedForward(num_experts=4, d_ff=32)
    x = rng.normal(size=(2, 8, 16)).astype("float32")
    y = layer(x)
    assert layer.router.compute_dtype == "float32"
    assert layer.experts.compute_dtype == "bfloat16"
    assert y.dtype == "bfloat16"
    logits = layer.router(keras.ops.cast(x, "bfloat16"))
    assert logits.dtype == "float32"
    assert all(np.isfinite(float(v)) for v in layer.losses)


def test_dot_keras_round_trip_gives_identical_outputs_in_safe_mode(rng, tmp_path):
    x, y = _data(rng)
    inputs = keras.Input((8, 16))
    h = keras_moe.SwitchFeedForward(
        num_experts=4, d_ff=32, jitter_noise=0.01, group_size=16, name="switch"
    )(inputs)
    h = keras_moe.GShardFeedForward(num_experts=4, d_ff=32, activation="gated-gelu", name="gshard")(
        h
    )
    custom = keras_moe.MoeLayer(
        keras_moe.TopKRouter(4, k=3, normalize_top_k=True),
        keras_moe.FeedForwardExperts(4, 16),
        name="topk",
    )(h)
    model = keras.Model(inputs, keras.layers.Dense(1)(custom))
    model.compile("adam", "mse")
    model.fit(x, y, epochs=1, verbose=0)
    path = os.path.join(tmp_path, "moe.keras")
    model.save(path)
    restored = keras.saving.load_model(path, safe_mode=True)
    np.testing.assert_array_equal(model.predict(x, verbose=0), restored.predict(x, verbose=0))
    cfg = restored.get_layer("gshard").get_config()
    assert cfg["activation"] == "gated-gelu" and cfg["num_experts"] == 4
    assert restored.get_layer("switch").router.jitter_noise == 0.01


def test_mirrored_strategy_matches_single_device(rng, two_cpu_strategy):
    x, y = _data(rng, n=16)

    def make():
        keras.utils.set_random_seed(3)
        model = keras.Sequential(
            [
                keras.Input((8, 16)),
                keras_moe.SwitchFeedForward(
                    num_experts=4, d_ff=32, name="moe", group_size="sequence"
                ),
                keras.layers.Dense(1),
            ]
        )
        model.compile(keras.optimizers.SGD(0.1), "mse")
        return model

    single = make()
    h1 = single.fit(x, y, epochs=2, batch_size=8, shuffle=False, verbose=0).history
    with two_cpu_strategy.scope():
        mirrored = make()
    h2 = mirrored.fit(x, y, epochs=2, batch_size=8, shuffle=False, verbose=0).history
    # Each replica routes its own half-batch; with sequences as groups the
    # routing is identical, so the trajectories agree.
    np.testing.assert_allclose(h1["loss"], h2["loss"], rtol=1e-4)
    for a, b in zip(single.get_weights(), mirrored.get_weights(), strict=False):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)


def test_expert_dropout_only_in_training(rng):
    layer = keras_moe.SwitchFeedForward(
        num_experts=2, d_ff=64, expert_dropout_rate=0.5, seed=1, train_capacity_factor=2.0
    )
    x = rng.normal(size=(2, 8, 16)).astype("float32")
    a, b = np.asarray(layer(x)), np.asarray(layer(x))
    np.testing.assert_array_equal(a, b)
    assert not np.allclose(np.asarray(layer(x, training=True)), a)


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(train_capacity_factor=0), "train_capacity_factor"),
        (dict(eval_capacity_factor=-1.0), "eval_capacity_factor"),
        (dict(min_expert_capacity=-1), "min_expert_capacity"),
        (dict(group_size=0), "group_size"),
        (dict(dispatch="fast"), "dispatch"),
        (dict(aux_loss_factor=-1), "aux_loss_factor"),
        (dict(num_experts=0), "num_experts"),
        (dict(d_ff=0), "d_ff"),
        (dict(activation="swish-ish"), "activation"),
        (dict(expert_dropout_rate=1.0), "dropout_rate"),
    ],
)
def test_bad_layer_arguments_name_the_argument(kwargs, match):
    args = dict(num_experts=4, d_ff=8)
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        keras_moe.SwitchFeedForward(**args)


def test_moe_layer_refuses_mismatch_and_causal_expert_choice():
    with pytest.raises(ValueError, match="num_experts"):
        keras_moe.MoeLayer(keras_moe.SwitchRouter(4), keras_moe.FeedForwardExperts(5, 8))
    with pytest.raises(ValueError, match="causal"):
        keras_moe.MoeLayer(
            keras_moe.ExpertChoiceRouter(4), keras_moe.FeedForwardExperts(4, 8), causal=True
        )
    layer = keras_moe.SwitchFeedForward(4, 8)
    layer.build((None, None, 8))
    unknown_length = tf.function(layer, input_signature=[tf.TensorSpec((2, None, 8))])
    with pytest.raises(ValueError, match="static sequence length"):
        unknown_length(tf.zeros((2, 3, 8)))


def test_metrics_prefix_keeps_two_layers_metrics_apart(rng):
    x, y = _data(rng)
    inputs = keras.Input((8, 16))
    h = keras_moe.SwitchFeedForward(4, 32, name="ffn", metrics_prefix="encoder/ffn")(inputs)
    h = keras_moe.SwitchFeedForward(4, 32, name="ffn_1", metrics_prefix="decoder/ffn")(h)
    model = keras.Model(inputs, keras.layers.Dense(1)(h))
    model.compile("adam", "mse")
    history = model.fit(x, y, epochs=1, verbose=0).history
    assert "encoder/ffn/dropped_fraction" in history and "decoder/ffn/dropped_fraction" in history
    assert model.layers[1].get_config()["metrics_prefix"] == "encoder/ffn"


def test_router_dtype_can_be_lowered_for_stability_studies(rng):
    keras.mixed_precision.set_global_policy("mixed_bfloat16")
    layer = keras_moe.SwitchFeedForward(num_experts=4, d_ff=16, router_dtype="bfloat16")
    layer(rng.normal(size=(2, 8, 16)).astype("float32"))
    assert layer.router.compute_dtype == "bfloat16"
    restored = keras_moe.SwitchFeedForward.from_config(layer.get_config())
    assert restored.router.compute_dtype == "bfloat16"
    assert keras_moe.GShardFeedForward(4, 16).router.compute_dtype == "float32"


def test_router_metrics_mixin_logs_the_layer_statistics(rng):
    from tests.core.router_metrics_checks import check_fit_history_matches_the_layer_statistics

    check_fit_history_matches_the_layer_statistics(rng)


def test_router_metrics_in_any_model_are_the_layer_statistics(rng):
    from tests.core.router_metrics_checks import check_router_metrics_are_measured_or_absent

    check_router_metrics_are_measured_or_absent(rng)


@pytest.mark.slow
def test_encoder_decoder_logs_router_metrics():
    from tests.core.router_metrics_checks import check_encoder_decoder_logs_router_metrics

    check_encoder_decoder_logs_router_metrics()


def test_return_metrics_at_call_time(rng):
    layer = keras_moe.SwitchFeedForward(num_experts=4, d_ff=32, name="moe")
    x = rng.normal(size=(2, 8, 16)).astype("float32")
    plain = layer(x)
    outputs, stats = layer(x, return_metrics=True)
    np.testing.assert_array_equal(np.asarray(outputs), np.asarray(plain))
    reference = keras_moe.SwitchFeedForward.from_config(
        {**layer.get_config(), "return_metrics": True, "name": "probe"}
    )
    reference.build(x.shape)
    reference.set_weights(layer.get_weights())
    _, expected = reference(x)
    for name in ("dropped_fraction", "router_entropy", "expert_load"):
        np.testing.assert_allclose(np.asarray(stats[name]), np.asarray(expected[name]), rtol=1e-6)
    assert not isinstance(reference(x, return_metrics=False), tuple)
    branch, symbolic = layer(keras.Input((8, 16)), return_metrics=True)  # functional models
    assert tuple(branch.shape) == (None, 8, 16) and symbolic["expert_load"].shape == (4,)


def test_two_dimensional_input_names_the_layer_and_the_expected_shape(rng):
    layer = keras_moe.SwitchFeedForward(num_experts=4, d_ff=32, name="my_moe")
    with pytest.raises(ValueError, match=r"'my_moe'.*\[batch, length, d_model\].*\(2, 16\)"):
        layer(rng.normal(size=(2, 16)).astype("float32"))
    with pytest.raises(ValueError, match=r"'my_moe'.*\[batch, length, d_model\]"):
        layer(keras.Input((16,)))
