"""Core-layer checks run in a fresh process with KERAS_BACKEND=jax.

Run by tests/core/test_jax_backend.py; prints one "OK <check>" line per check.
"""

import math
import os
import sys
import tempfile

os.environ["KERAS_BACKEND"] = "jax"
os.environ.setdefault("JAX_PLATFORMS", "cpu")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import jax
import keras
import numpy as np

import keras_moe
from tests.core.reference import reference_moe

assert keras.backend.backend() == "jax"
rng = np.random.default_rng(0)


def check_reference():
    for k, dispatch in ((1, "einsum"), (1, "gather"), (2, "gather"), (2, "einsum")):
        router = keras_moe.TopKRouter(4, k=k)
        layer = keras_moe.MoeLayer(
            router,
            keras_moe.FeedForwardExperts(4, 16, init_scale=1.0),
            dispatch=dispatch,
            eval_capacity_factor=0.75,
            min_expert_capacity=0,
            group_size="sequence",
        )
        x = rng.normal(size=(2, 12, 8)).astype("float32")
        mask = np.ones((2, 12), "float32")
        mask[1, 8:] = 0
        y = np.asarray(layer(x, mask=mask))
        weights = {"router": np.asarray(layer.router.kernel.numpy())}
        weights.update({v.name: np.asarray(v.numpy()) for v in layer.experts.weights})
        expected, _, aux, _ = reference_moe(  # capacity from each sequence's real tokens
            x, mask, weights, k, lambda n, k=k: min(n, math.ceil(0.75 * k * n / 4))
        )
        np.testing.assert_allclose(y, expected, rtol=2e-4, atol=2e-5)
        np.testing.assert_allclose(float(layer.losses[0]), 1e-2 * aux, rtol=1e-4)
    print("OK reference")


def _same_weight_layers(*kwargs_list):
    """GShard layers built with the first one's weights, one per kwargs dict."""
    layers = [keras_moe.GShardFeedForward(6, 16, seed=0, **kwargs) for kwargs in kwargs_list]
    for layer in layers:
        layer.build((3, 10, 8))
    for layer in layers[1:]:
        layer.set_weights(layers[0].get_weights())
    return layers


def _outputs_and_gradients(layer, x, mask):
    """Outputs and gradients (weights, input) of one jit-compiled step."""

    def objective(trainable, inputs):
        y, _ = layer.stateless_call(
            trainable,
            [v.value for v in layer.non_trainable_variables],
            inputs,
            mask=mask,
            training=False,
        )
        return (y * np.sin(np.arange(8, dtype="float32"))).sum(), y

    step = jax.jit(jax.value_and_grad(objective, argnums=(0, 1), has_aux=True))
    (_, y), grads = step([v.value for v in layer.trainable_variables], x)
    return np.asarray(y), [np.asarray(g) for g in jax.tree_util.tree_leaves(grads)]


def _assert_same(a, b):
    np.testing.assert_allclose(a[0], b[0], rtol=1e-5, atol=1e-6)
    for ga, gb in zip(a[1], b[1], strict=False):
        np.testing.assert_allclose(ga, gb, rtol=1e-4, atol=1e-6)


def check_gradients_agree():
    x = rng.normal(size=(3, 10, 8)).astype("float32")
    mask = np.ones((3, 10), "float32")
    einsum, gather = _same_weight_layers(dict(dispatch="einsum"), dict(dispatch="gather"))
    _assert_same(*(_outputs_and_gradients(layer, x, mask) for layer in (einsum, gather)))
    print("OK gradients")


def check_dropless():
    """The tiled grouped matmul under jax.jit: the same outputs and gradients as gather
    with room for all; no warning."""
    from tests.core.helpers import check_dropless_choice

    check_dropless_choice()
    x = rng.normal(size=(3, 10, 8)).astype("float32")
    mask = np.ones((3, 10), "float32")
    mask[2, 6:] = 0
    gather, dropless = _same_weight_layers(
        dict(dispatch="gather", eval_capacity_factor=6.0), dict(dispatch="dropless")
    )
    results = [_outputs_and_gradients(layer, x, mask) for layer in (gather, dropless)]
    _assert_same(*results)
    assert np.all(results[1][0][2, 6:] == 0)
    _check_grouped_matmul_kernels()
    print("OK dropless")


def _check_grouped_matmul_kernels():
    """Each JAX kernel against float64 NumPy, outputs and gradients: empty groups, rows
    past the groups, groups of more than one tile."""
    import jax

    from keras_moe.dispatch.grouped_matmul import grouped_matmul

    for rows, sizes in ((11, [4, 0, 5]), (300, [0, 97, 3, 150, 0, 41])):
        x = rng.normal(size=(rows, 6))
        w = rng.normal(size=(len(sizes), 6, 5))
        c = rng.normal(size=(rows, 5))  # the objective's weights: sum(y * c)
        groups = np.repeat(np.arange(len(sizes)), sizes)
        inside = len(groups)
        want = np.zeros((rows, 5))
        want[:inside] = np.einsum("rk,rkn->rn", x[:inside], w[groups])
        want_dx = np.zeros_like(x)
        want_dx[:inside] = np.einsum("rn,rkn->rk", c[:inside], w[groups])
        want_dw = np.zeros_like(w)
        np.add.at(want_dw, groups, np.einsum("rk,rn->rkn", x[:inside], c[:inside]))
        group_sizes, weights = np.array(sizes), c.astype("float32")
        for kernel in ("tiled", "looped", "ragged_dot"):

            def objective(x, w, kernel=kernel, group_sizes=group_sizes, weights=weights):
                y = grouped_matmul(x, w, group_sizes, kernel=kernel)
                return jax.numpy.sum(y * weights), y

            (_, y), (dx, dw) = jax.jit(jax.value_and_grad(objective, argnums=(0, 1), has_aux=True))(
                x.astype("float32"), w.astype("float32")
            )
            for got, expected in ((y, want), (dx, want_dx), (dw, want_dw)):
                np.testing.assert_allclose(
                    np.asarray(got), expected, rtol=1e-4, atol=1e-4, err_msg=kernel
                )


def check_empty_batch():
    """A batch of 0 sequences (an empty replica; no groups at all): outputs [0, L, d],
    losses and statistics of 0 for every dispatcher, finite gradients of a jit-compiled step."""
    x, mask = np.zeros((0, 10, 8), "float32"), np.zeros((0, 10), "float32")
    for dispatch in ("gather", "einsum", "dropless"):
        layer = keras_moe.GShardFeedForward(
            6, 16, dispatch=dispatch, group_size="sequence", return_metrics=True
        )
        y, stats = layer(x, mask=mask)
        assert y.shape == (0, 10, 8), y.shape
        assert all(np.all(np.asarray(v) == 0) for v in stats.values()), stats
        assert [float(v) for v in layer.losses] == [0.0, 0.0]
    (layer,) = _same_weight_layers(dict(group_size=5))
    y, grads = _outputs_and_gradients(layer, x, mask)
    assert y.shape == (0, 10, 8) and all(np.all(np.isfinite(g)) for g in grads)
    print("OK empty_batch")


def check_fit_and_save():
    keras.mixed_precision.set_global_policy("mixed_bfloat16")
    inputs = keras.Input((8, 16))
    moe = keras_moe.SwitchFeedForward(4, 32, name="moe", return_metrics=True, jitter_noise=0.01)
    branch, stats = moe(inputs)
    out = keras.layers.Dense(1, dtype="float32")(keras.layers.Add()([inputs, branch]))
    model = keras.Model(inputs, {"y": out, "dropped": stats["dropped_fraction"]})
    assert moe.router.compute_dtype == "float32"

    class PredictionMean(keras.metrics.Mean):
        def update_state(self, y_true, y_pred, sample_weight=None):
            return super().update_state(y_pred)

    model.compile(
        keras.optimizers.Adam(1e-2),
        loss={"y": "mse"},
        metrics={"dropped": [PredictionMean(name="fraction")]},
    )
    x = rng.normal(size=(32, 8, 16)).astype("float32")
    y = {"y": np.tanh(x.sum(-1, keepdims=True)), "dropped": np.zeros((32,), "float32")}
    history = model.fit(x, y, epochs=3, batch_size=8, verbose=0).history
    assert history["loss"][-1] < history["loss"][0], history["loss"]
    assert 0.0 <= history["dropped_fraction"][-1] <= 1.0
    path = os.path.join(tempfile.mkdtemp(), "m.keras")
    model.save(path)
    restored = keras.saving.load_model(
        path, safe_mode=True, custom_objects={"PredictionMean": PredictionMean}
    )
    # (predict() would concatenate the scalar statistic per batch: call directly.)
    np.testing.assert_array_equal(
        np.asarray(model(x, training=False)["y"]), np.asarray(restored(x, training=False)["y"])
    )
    keras.mixed_precision.set_global_policy("float32")
    print("OK fit_save_bf16")


def check_router_metrics():
    from tests.core import router_metrics_checks

    router_metrics_checks.check_fit_history_matches_the_layer_statistics(rng)
    router_metrics_checks.check_encoder_decoder_logs_router_metrics()
    router_metrics_checks.check_router_metrics_are_measured_or_absent(rng)
    x = rng.normal(size=(8, 8, 16)).astype("float32")
    outputs, stats = keras_moe.SwitchFeedForward(4, 32)(x, return_metrics=True)
    assert outputs.shape == x.shape and stats["expert_load"].shape == (4,)
    print("OK router_metrics")


def check_compiled_decoding():
    from keras_moe.models import EncoderDecoder
    from keras_moe.models.decoding import generate
    from tests.models.helpers import tiny_switch_config

    keras.utils.set_random_seed(4)
    model = EncoderDecoder(tiny_switch_config(vocab_size=8, min_expert_capacity=32))
    inputs = np.array([[5, 6, 7, 1, 0], [2, 3, 1, 0, 0], [4, 5, 6, 7, 1]], "int32")
    for method in ("greedy", "beam"):
        reference = generate(
            model, inputs, max_length=8, method=method, num_beams=3, compiled=False
        )
        tokens = generate(model, inputs, max_length=8, method=method, num_beams=3)
        np.testing.assert_array_equal(tokens, reference)
    print("OK compiled_decoding")


def check_upcycle():
    """Upcycled granular experts (zero router) start at the dense logits (the top-1 and
    replicated-router starts are checked on TensorFlow: the copy is the same on both)."""
    from keras_moe import TopKFeedForward
    from keras_moe.models.upcycle import upcycle_weights
    from tests.models.test_upcycle import _batch, _logits, _pair

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
    print("OK upcycle")


check_reference()
check_gradients_agree()
check_dropless()
check_empty_batch()
check_fit_and_save()
check_router_metrics()
check_compiled_decoding()
check_upcycle()
