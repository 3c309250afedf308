"""Routers: hand-computed cases, policies, invariants, expert choice."""

import math

import numpy as np
import pytest

from keras_moe import routing


def _route(router, logits, mask=None, capacity=4, training=False):
    logits = np.asarray(logits, "float32")
    if mask is None:
        mask = np.ones(logits.shape[:2], "float32")
    r = router.route(logits, mask, capacity, training=training)
    return {k: (np.asarray(v) if not isinstance(v, int) else v) for k, v in r._asdict().items()}


def test_switch_router_hand_computed_priority_and_drop():
    # 4 tokens, 2 experts, capacity 1: tokens 0 and 1 both prefer expert 0.
    logits = [[[2.0, 0.0], [1.0, 0.0], [0.0, 3.0], [0.0, 1.0]]]
    r = _route(routing.SwitchRouter(2), logits, capacity=1)
    np.testing.assert_array_equal(r["expert_index"][0, :, 0], [0, 0, 1, 1])
    np.testing.assert_array_equal(r["kept"][0, :, 0], [1, 0, 1, 0])  # first come, first served
    np.testing.assert_array_equal(r["position"][0, [0, 2], 0], [0, 0])
    p0 = math.exp(2) / (math.exp(2) + 1)
    p2 = math.exp(3) / (math.exp(3) + 1)
    np.testing.assert_allclose(r["combine_weight"][0, :, 0], [p0, 0, p2, 0], rtol=1e-6)


def test_batch_prioritized_routing_serves_confident_tokens_first():
    logits = [[[1.0, 0.0], [4.0, 0.0], [0.0, 1.0]]]  # token 1 is the most confident
    r = _route(routing.SwitchRouter(2, batch_prioritized_routing=True), logits, capacity=1)
    np.testing.assert_array_equal(r["kept"][0, :, 0], [0, 1, 1])


def test_z_loss_and_aux_loss_of_known_logits():
    logits = np.array([[[0.0, 0.0], [math.log(3.0), 0.0]]], "float32")
    r = _route(routing.SwitchRouter(2), logits)
    lse = [math.log(2.0), math.log(4.0)]
    assert r["z_loss"] == pytest.approx(np.mean(np.square(lse)), rel=1e-5)
    # Both tokens pick expert 0 (argmax tie -> first). f = [1, 0]; P_0 = (0.5 + 0.75) / 2.
    assert r["aux_loss"] == pytest.approx(2 * 1.0 * 0.625, rel=1e-5)


def test_padding_takes_no_capacity_and_adds_nothing_to_losses():
    logits = np.array([[[5.0, 0.0], [5.0, 0.0], [0.0, 5.0]]], "float32")
    mask = np.array([[0.0, 1.0, 1.0]], "float32")
    r = _route(routing.SwitchRouter(2), logits, mask, capacity=1)
    np.testing.assert_array_equal(r["kept"][0, :, 0], [0, 1, 1])  # token 1 gets the slot
    r_ref = _route(routing.SwitchRouter(2), logits[:, 1:], capacity=1)
    assert r["aux_loss"] == pytest.approx(r_ref["aux_loss"], rel=1e-6)
    assert r["z_loss"] == pytest.approx(r_ref["z_loss"], rel=1e-6)


def test_top2_all_policy_normalizes_before_capacity():
    logits = np.log(np.array([[[0.5, 0.3, 0.2], [0.6, 0.1, 0.3]]], "float32"))
    r = _route(routing.Top2Router(3, second_expert_policy="all"), logits, capacity=1, training=True)
    np.testing.assert_array_equal(r["expert_index"][0], [[0, 1], [0, 2]])
    # Token 1's first choice (expert 0) overflows: first choices are served first.
    np.testing.assert_array_equal(r["kept"][0], [[1, 1], [0, 1]])
    np.testing.assert_allclose(
        r["combine_weight"][0], [[0.5 / 0.8, 0.3 / 0.8], [0, 0.3 / 0.9]], rtol=1e-5
    )
    after = _route(
        routing.Top2Router(3, second_expert_policy="all", normalize_gates="after_capacity"),
        logits,
        capacity=1,
        training=True,
    )
    np.testing.assert_allclose(after["combine_weight"][0, 1], [0, 1.0], rtol=1e-5)


def test_top2_threshold_and_random_policies(rng):
    probs = np.array([[[0.7, 0.3, 0.0 + 1e-6], [0.95, 0.05, 1e-6]]], "float32")
    logits = np.log(probs)
    r = _route(
        routing.Top2Router(3, second_expert_policy="threshold", second_expert_threshold=0.2),
        logits,
        training=True,
    )
    np.testing.assert_array_equal(r["kept"][0, :, 1], [1, 0])
    # Random policy keeps the second expert with probability g2 / 0.5 (GShard).
    logits = np.log(np.tile(np.array([0.8, 0.2, 1e-6], "float32"), (1, 4000, 1)))
    router = routing.Top2Router(3, second_expert_policy="random", seed=3)
    r = _route(router, logits, capacity=10000, training=True)
    assert r["kept"][0, :, 1].mean() == pytest.approx(2 * 0.2, abs=0.03)
    # In inference the default policy is deterministic ("all").
    r_eval = _route(router, logits, capacity=10000, training=False)
    assert r_eval["kept"][0, :, 1].mean() == 1.0


def test_expert_choice_each_expert_takes_its_top_tokens():
    probs_logits = np.log(np.array([[[0.9, 0.1], [0.6, 0.4], [0.2, 0.8], [0.5, 0.5]]], "float32"))
    r = _route(routing.ExpertChoiceRouter(2), probs_logits, capacity=2)
    np.testing.assert_array_equal(r["kept"][0], [[1, 0], [1, 0], [0, 1], [0, 1]])
    np.testing.assert_array_equal(r["kept"].sum(axis=(0, 1)), [2, 2])
    assert r["aux_loss"] == 0.0


def test_expert_choice_never_picks_padding_when_real_tokens_suffice():
    logits = np.log(np.array([[[0.99, 0.01], [0.5, 0.5], [0.4, 0.6]]], "float32"))
    mask = np.array([[0, 1, 1]], "float32")
    r = _route(routing.ExpertChoiceRouter(2), logits, mask, capacity=1)
    assert r["kept"][0, 0].sum() == 0


@pytest.mark.parametrize(
    "router_factory",
    [
        lambda: routing.SwitchRouter(5),
        lambda: routing.TopKRouter(5, k=3, batch_prioritized_routing=True),
        lambda: routing.Top2Router(5, second_expert_policy="random", seed=1),
        lambda: routing.ExpertChoiceRouter(5),
    ],
)
def test_invariants_on_random_inputs(rng, router_factory):
    router = router_factory()
    logits = rng.normal(size=(3, 20, 5)).astype("float32") * 2
    mask = (rng.random((3, 20)) > 0.2).astype("float32")
    capacity = 3
    r = _route(router, logits, mask, capacity=capacity, training=True)
    kept = r["kept"]
    assert set(np.unique(kept)) <= {0.0, 1.0}
    assert np.all(kept[mask == 0] == 0)  # padding never routed
    assert np.all((r["combine_weight"] >= 0) & (r["combine_weight"] <= 1 + 1e-6))
    assert np.all(r["combine_weight"][kept == 0] == 0)
    if not isinstance(router, routing.ExpertChoiceRouter):
        assert np.all(r["combine_weight"].sum(-1) <= 1 + 1e-5)
    for g in range(3):
        slots = {}
        for s in range(20):
            for k in range(kept.shape[-1]):
                if kept[g, s, k]:
                    key = (r["expert_index"][g, s, k], r["position"][g, s, k])
                    assert key not in slots, "two tokens in one slot"
                    assert 0 <= key[1] < capacity
                    slots[key] = s
        # each token reaches each expert at most once
        for s in range(20):
            chosen = r["expert_index"][g, s][kept[g, s] > 0]
            assert len(set(chosen.tolist())) == len(chosen)


def test_jitter_only_in_training(rng):
    router = routing.SwitchRouter(4, jitter_noise=0.2, seed=0)
    x = rng.normal(size=(1, 6, 8)).astype("float32")
    a = np.asarray(router(x, training=False))
    np.testing.assert_array_equal(a, np.asarray(router(x, training=False)))
    c = np.asarray(router(x, training=True))
    assert not np.allclose(a, c)
    # Each input feature is scaled by a factor in [0.8, 1.2]: bound the logit change.
    bound = 0.2 * np.abs(x)[..., None] * np.abs(np.asarray(router.kernel))[None, None]
    assert np.all(np.abs(c - a) <= bound.sum(-2) + 1e-5)


def test_jitter_never_reaches_the_experts(rng):
    import keras_moe

    # One expert: its combine weight is 1 whatever the noise, so any difference
    # between training and inference outputs would be noise reaching the expert.
    layer = keras_moe.SwitchFeedForward(
        num_experts=1, d_ff=16, jitter_noise=0.5, train_capacity_factor=1.0, seed=0
    )
    x = rng.normal(size=(2, 8, 8)).astype("float32")
    clean = np.asarray(layer(x, training=False))
    jittered = np.asarray(layer(x, training=True))
    np.testing.assert_allclose(jittered, clean, rtol=1e-6, atol=1e-6)
    assert np.abs(clean).sum() > 0


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(num_experts=0), "num_experts"),
        (dict(num_experts=4, k=5), "k"),
        (dict(num_experts=4, k=0), "k"),
        (dict(num_experts=4, jitter_noise=-0.1), "jitter_noise"),
    ],
)
def test_bad_router_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        routing.TopKRouter(**kwargs)


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(second_expert_policy="sometimes"), "second_expert_policy"),
        (dict(eval_second_expert_policy="random"), "eval_second_expert_policy"),
        (dict(normalize_gates="never"), "normalize_gates"),
        (dict(second_expert_threshold=0.0), "second_expert_threshold"),
    ],
)
def test_bad_top2_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        routing.Top2Router(4, **kwargs)


@pytest.mark.parametrize(
    "router", [routing.SwitchRouter(4), routing.Top2Router(4), routing.TopKRouter(4, k=3)]
)
def test_capacity_is_capped_at_the_group_size_and_still_drops_nothing(router):
    assert router.expert_capacity(1, 1.25, min_expert_capacity=4) == 1  # one decoding token
    assert router.expert_capacity(3, 1.25, min_expert_capacity=4) == 3
    assert router.expert_capacity(64, 1.25, min_expert_capacity=4) == math.ceil(
        1.25 * router.num_choices() * 64 / 4
    )
    # Three tokens that all prefer expert 0 fit in the capped capacity of 3.
    logits = [[[3.0, 2.0, 1.0, 0.0]] * 3]
    r = _route(router, logits, capacity=router.expert_capacity(3, 1.0, 4))
    assert r["kept"].all()
