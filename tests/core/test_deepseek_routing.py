"""DeepSeek-V3 routing: sigmoid scores, group-limited top-k, scaled weights, bias balancing.

The router is checked against HF transformers' DeepseekV3TopkRouter (torch, CPU)
on the same random weights and bias, and the bias updates against a float64
NumPy run of the update rule (`deepseek_reference.py`).
"""

import keras
import numpy as np
import pytest
import torch  # test-only reference
from transformers import DeepseekV3Config
from transformers.models.deepseek_v3 import modeling_deepseek_v3 as deepseek

import keras_moe
from keras_moe.routing import losses as router_losses
from tests.core import deepseek_reference as reference
from tests.core.helpers import run_jax_checks

D, E, K, N_GROUP, TOPK_GROUP = 16, 16, 4, 4, 2


def _router(**kwargs):
    args = dict(
        k=K,
        score_function="sigmoid",
        normalize_top_k=True,
        routed_scaling_factor=2.5,
        n_group=N_GROUP,
        topk_group=TOPK_GROUP,
        selection_bias=True,
    )
    args.update(kwargs)
    router = keras_moe.TopKRouter(E, **args)
    router.build((None, None, D))
    return router


def _sorted_choices(index, weight):
    order = np.argsort(index, axis=-1)
    return np.take_along_axis(index, order, -1), np.take_along_axis(weight, order, -1)


@pytest.mark.parametrize("norm_topk_prob", [True, False])
def test_router_matches_hf_deepseek_v3(rng, norm_topk_prob):
    config = DeepseekV3Config(
        hidden_size=D,
        n_routed_experts=E,
        num_experts_per_tok=K,
        n_group=N_GROUP,
        topk_group=TOPK_GROUP,
        norm_topk_prob=norm_topk_prob,
        routed_scaling_factor=2.5,
    )
    hf = deepseek.DeepseekV3TopkRouter(config).eval()
    weight = rng.normal(0, 0.5, size=(E, D)).astype("float32")
    bias = rng.normal(0, 0.3, size=(E,)).astype("float32")
    with torch.no_grad():
        hf.weight.copy_(torch.from_numpy(weight))
        hf.e_score_correction_bias.copy_(torch.from_numpy(bias))
    router = _router(normalize_top_k=norm_topk_prob)
    router.kernel.assign(weight.T)
    router.expert_bias.assign(bias)

    x = rng.normal(size=(3, 10, D)).astype("float32")
    with torch.no_grad():
        _, hf_weight, hf_index = hf(torch.from_numpy(x))
    routing = router.route(router(x), np.ones((3, 10)), capacity=10)
    got_index, got_weight = _sorted_choices(
        np.asarray(routing.expert_index).reshape(-1, K),
        np.asarray(routing.combine_weight).reshape(-1, K),
    )
    want_index, want_weight = _sorted_choices(hf_index.numpy(), hf_weight.numpy())
    np.testing.assert_array_equal(got_index, want_index)
    np.testing.assert_allclose(got_weight, want_weight, rtol=1e-5, atol=1e-5)

    # The case is one where the bias and the groups change the choice.
    scores = reference.sigmoid(x.reshape(-1, D) @ weight.T)
    plain = np.sort(np.argsort(-scores, -1)[:, :K], -1)
    no_bias = np.sort(reference.select(scores, 0.0, K, N_GROUP, TOPK_GROUP), -1)
    no_groups = np.sort(reference.select(scores, bias, K, 1, 1), -1)
    assert (plain != got_index).any() and (no_bias != got_index).any()
    assert (no_groups != got_index).any()


def test_combine_weights_are_scaled_for_any_router(rng):
    logits = rng.normal(size=(2, 6, 4)).astype("float32")
    for cls, kwargs in (
        (keras_moe.TopKRouter, dict(k=2)),
        (keras_moe.Top2Router, {}),
        (keras_moe.ExpertChoiceRouter, {}),
    ):
        plain = cls(4, **kwargs).route(logits, np.ones((2, 6)), capacity=6)
        scaled = cls(4, routed_scaling_factor=3.0, **kwargs).route(
            logits, np.ones((2, 6)), capacity=6
        )
        np.testing.assert_allclose(
            np.asarray(scaled.combine_weight), 3.0 * np.asarray(plain.combine_weight), rtol=1e-6
        )


def test_sigmoid_scores_and_their_load_balancing_loss(rng):
    logits = rng.normal(size=(2, 8, 4)).astype("float32")
    mask = np.ones((2, 8), "float32")
    mask[1, 5:] = 0
    routing = keras_moe.TopKRouter(4, k=2, score_function="sigmoid").route(logits, mask, 8)
    scores = reference.sigmoid(logits)
    top = np.argsort(-scores, -1)[..., :2]
    np.testing.assert_array_equal(np.asarray(routing.expert_index), top)
    np.testing.assert_allclose(
        np.asarray(routing.combine_weight),
        np.take_along_axis(scores, top, -1) * mask[..., None],
        rtol=1e-6,
    )
    # P_e: the scores normalised over experts, as DeepSeek-V3's sequence-wise loss.
    probs = scores / scores.sum(-1, keepdims=True)
    np.testing.assert_allclose(np.asarray(routing.router_probs), probs, rtol=1e-6)
    expected = []
    for g in range(2):
        real = mask[g] > 0
        f = np.bincount(top[g, real, 0], minlength=4) / real.sum()
        expected.append(4 * np.sum(f * probs[g, real].mean(0)))
    np.testing.assert_allclose(float(routing.aux_loss), np.mean(expected), rtol=1e-5)
    # Its minimum is still 1.0, at a uniform router.
    uniform = np.zeros((1, 4, 4), "float32")
    flat = keras_moe.TopKRouter(4, score_function="sigmoid").route(uniform, np.ones((1, 4)), 4)
    assert float(
        router_losses.load_balancing_loss(
            flat.router_probs, np.array([[0, 1, 2, 3]]), np.ones((1, 4))
        )
    ) == pytest.approx(1.0)


@pytest.mark.parametrize(
    "kwargs,message",
    [
        (dict(score_function="relu"), "`score_function` must be one of"),
        (dict(routed_scaling_factor=0.0), "`routed_scaling_factor` must be a number > 0"),
        (dict(n_group=3), "`n_group` must divide num_experts \\(8\\)"),
        (dict(n_group=0), "`n_group` must be an integer >= 1"),
        (dict(n_group=4, topk_group=5), "`topk_group` must be <= n_group \\(4\\)"),
        (dict(n_group=4, topk_group=0), "`topk_group` must be an integer >= 1"),
        (dict(k=3, n_group=4, topk_group=1), "`k` must be <= the experts of the kept groups.*= 2"),
        (dict(bias_update_rate=-1e-3, selection_bias=True), "`bias_update_rate` must be a number"),
        (dict(bias_update_rate=1e-3), "`bias_update_rate` > 0 .* needs `selection_bias=True`"),
    ],
)
def test_invalid_arguments_are_named(kwargs, message):
    with pytest.raises(ValueError, match=message):
        keras_moe.TopKRouter(8, **{"k": 2, **kwargs})


def _bias_model(rate, dispatch="gather"):
    router = _router(bias_update_rate=rate, normalize_top_k=True)
    layer = keras_moe.MoeLayer(
        router,
        keras_moe.FeedForwardExperts(E, 8),
        group_size="sequence",
        dispatch=dispatch,
        train_capacity_factor=float(E),
        eval_capacity_factor=float(E),
        track_metrics=False,
    )
    inputs = keras.Input((6, D))
    model = keras.Model(inputs, layer(inputs))
    # Learning rate 0: the kernel stays fixed, so the choices move only with the bias.
    model.compile(optimizer=keras.optimizers.SGD(0.0), loss="mse")
    return model, router


def test_bias_follows_three_training_steps_and_inference_leaves_it(rng):
    rate = 0.0625  # a power of two: the float32 bias is exact
    model, router = _bias_model(rate)
    x = rng.normal(size=(4, 6, D)).astype("float32")
    y = rng.normal(size=(4, 6, D)).astype("float32")
    history, counts = reference.bias_sequence(
        x, np.asarray(router.kernel.numpy(), "float64"), K, N_GROUP, TOPK_GROUP, rate, 3
    )
    assert not np.array_equal(counts[0], counts[1])  # the bias changed what was chosen

    seen = []
    record = keras.callbacks.LambdaCallback(
        on_train_batch_end=lambda batch, logs: seen.append(router.expert_bias.numpy().copy())
    )
    model.fit(
        np.concatenate([x] * 3),
        np.concatenate([y] * 3),
        batch_size=4,
        epochs=1,
        shuffle=False,
        verbose=0,
        callbacks=[record],
    )
    np.testing.assert_allclose(np.array(seen), np.array(history), atol=1e-6)

    after = router.expert_bias.numpy().copy()
    model.evaluate(x, y, verbose=0)
    model.predict(x, verbose=0)
    model(x, training=False)
    model(x)
    np.testing.assert_array_equal(router.expert_bias.numpy(), after)


def test_bias_counts_the_global_batch_under_mirrored_strategy(rng, two_cpu_strategy):
    rate = 0.0625
    with two_cpu_strategy.scope():
        model, router = _bias_model(rate)
    x = rng.normal(size=(4, 6, D)).astype("float32")
    y = rng.normal(size=(4, 6, D)).astype("float32")
    history, counts = reference.bias_sequence(
        x, np.asarray(router.kernel.numpy(), "float64"), K, N_GROUP, TOPK_GROUP, rate, 2
    )
    # Each replica alone would move the bias otherwise.
    local, _ = reference.bias_sequence(
        x[:2], np.asarray(router.kernel.numpy(), "float64"), K, N_GROUP, TOPK_GROUP, rate, 1
    )
    assert not np.array_equal(local[0], history[0])
    model.fit(
        np.concatenate([x] * 2), np.concatenate([y] * 2), batch_size=4, shuffle=False, verbose=0
    )
    np.testing.assert_allclose(router.expert_bias.numpy(), history[-1], atol=1e-6)
    for value in router.expert_bias.value.values:  # every replica's copy
        np.testing.assert_allclose(value.numpy(), history[-1], atol=1e-6)


def test_bias_selects_but_does_not_weight(rng):
    router = _router(
        n_group=1, topk_group=None, k=1, normalize_top_k=False, routed_scaling_factor=1.0
    )
    router.expert_bias.assign(np.eye(E, dtype="float32")[3] * 10.0)
    x = rng.normal(size=(1, 5, D)).astype("float32")
    logits = router(x)
    routing = router.route(logits, np.ones((1, 5)), capacity=5)
    assert (np.asarray(routing.expert_index) == 3).all()
    np.testing.assert_allclose(
        np.asarray(routing.combine_weight)[..., 0],
        reference.sigmoid(np.asarray(logits))[..., 3],
        rtol=1e-6,
    )


def test_bias_is_saved_and_restored(tmp_path, rng):
    model, router = _bias_model(0.01)
    bias = rng.normal(size=(E,)).astype("float32")
    router.expert_bias.assign(bias)
    assert [w.path for w in router.non_trainable_weights] == [router.expert_bias.path]
    model.save(tmp_path / "m.keras")
    loaded = keras.saving.load_model(tmp_path / "m.keras")
    restored = [sub for sub in loaded.layers if isinstance(sub, keras_moe.MoeLayer)][0].router
    np.testing.assert_array_equal(restored.expert_bias.numpy(), bias)
    assert restored.get_config() == router.get_config()
    x = rng.normal(size=(2, 6, D)).astype("float32")
    np.testing.assert_allclose(
        loaded.predict(x, verbose=0), model.predict(x, verbose=0), rtol=1e-6, atol=1e-6
    )


@pytest.mark.slow
@pytest.mark.jax
def test_deepseek_routing_on_jax():
    run_jax_checks("deepseek_jax_checks.py", ("hf_selection", "fit_bias", "mesh_bias"))
