"""Router and layer invariants over random shapes, expert counts, k, capacities, masks, dtypes."""

import keras
import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import keras_moe
from keras_moe import dispatch as dispatch_lib
from keras_moe import routing

SETTINGS = settings(
    max_examples=25, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow]
)


@st.composite
def routing_cases(draw):
    num_experts = draw(st.integers(1, 9))
    kind = draw(st.sampled_from(["topk", "top2", "expert_choice"]))
    if kind == "top2" and num_experts < 2:
        kind = "topk"
    k = draw(st.integers(1, num_experts)) if kind == "topk" else 2
    groups = draw(st.integers(1, 3))
    group_size = draw(st.integers(1, 12))
    capacity_factor = draw(st.sampled_from([0.1, 0.5, 1.0, 1.25, 2.0, 4.0]))
    min_capacity = draw(st.integers(0, 3))
    seed = draw(st.integers(0, 2**16))
    dtype = draw(st.sampled_from(["float32", "bfloat16"]))
    rng = np.random.default_rng(seed)
    logits = (rng.normal(size=(groups, group_size, num_experts)) * rng.uniform(0.1, 5)).astype(
        "float32"
    )
    mask = (rng.random((groups, group_size)) > draw(st.sampled_from([0.0, 0.3, 1.0]))).astype(
        "float32"
    )
    return dict(
        kind=kind,
        num_experts=num_experts,
        k=k,
        capacity_factor=capacity_factor,
        min_capacity=min_capacity,
        logits=logits,
        mask=mask,
        seed=seed,
        dtype=dtype,
        bpr=bool(seed % 2),
        policy=["all", "random", "threshold"][seed % 3],
    )


def _router(case):
    if case["kind"] == "topk":
        return routing.TopKRouter(
            case["num_experts"],
            k=case["k"],
            batch_prioritized_routing=case["bpr"],
            seed=case["seed"],
        )
    if case["kind"] == "top2":
        return routing.Top2Router(
            case["num_experts"],
            second_expert_policy=case["policy"],
            batch_prioritized_routing=case["bpr"],
            seed=case["seed"],
        )
    return routing.ExpertChoiceRouter(case["num_experts"])


@SETTINGS
@given(routing_cases())
def test_routing_invariants(case):
    router = _router(case)
    capacity = router.expert_capacity(
        case["logits"].shape[1], case["capacity_factor"], case["min_capacity"]
    )
    r = router.route(case["logits"], case["mask"], capacity, training=True)
    kept = np.asarray(r.kept)
    weight = np.asarray(r.combine_weight)
    expert = np.asarray(r.expert_index)
    position = np.asarray(r.position)
    mask = case["mask"]
    assert np.all(kept[mask == 0] == 0), "padding was routed"
    assert np.all((weight >= 0) & (weight <= 1 + 1e-6))
    assert np.all(weight[kept == 0] == 0)
    if case["kind"] != "expert_choice":
        assert np.all(kept.sum(-1) <= case["k"])  # each token in <= k experts
        assert np.all(weight.sum(-1) <= 1 + 1e-5)
    for g in range(kept.shape[0]):
        load = np.zeros(case["num_experts"], int)
        seen = set()
        for s, c in zip(*np.nonzero(kept[g]), strict=False):
            e, p = expert[g, s, c], position[g, s, c]
            assert 0 <= p < capacity
            assert (e, p) not in seen
            seen.add((e, p))
            load[e] += 1
        assert load.max(initial=0) <= capacity  # no expert over capacity


@SETTINGS
@given(routing_cases())
def test_dispatchers_agree_and_dropped_tokens_output_zero(case):
    keras.mixed_precision.set_global_policy(
        "mixed_bfloat16" if case["dtype"] == "bfloat16" else "float32"
    )
    try:
        groups, group_size, _ = case["logits"].shape
        d_model = 6
        rng = np.random.default_rng(case["seed"])
        x = rng.normal(size=(groups, group_size, d_model)).astype("float32")
        layers = []
        for mode in ("einsum", "gather"):
            layers.append(
                keras_moe.MoeLayer(
                    _router(case),
                    keras_moe.FeedForwardExperts(case["num_experts"], 8),
                    dispatch=mode,
                    # One group per sequence, as the router's own call below routes.
                    group_size="sequence",
                    eval_capacity_factor=case["capacity_factor"],
                    min_expert_capacity=case["min_capacity"],
                )
            )
            layers[-1].build(x.shape)
        layers[1].set_weights(layers[0].get_weights())
        ya = np.asarray(keras.ops.cast(layers[0](x, mask=case["mask"]), "float32"))
        yb = np.asarray(keras.ops.cast(layers[1](x, mask=case["mask"]), "float32"))
        tol = 2e-2 if case["dtype"] == "bfloat16" else 1e-5
        np.testing.assert_allclose(ya, yb, rtol=tol, atol=tol)
        assert np.all(ya[case["mask"] == 0] == 0)
        # Tokens that no expert kept give exactly 0.
        logits = layers[0].router(x)
        capacity = layers[0].capacity(group_size, training=False)
        r = layers[0].router.route(logits, case["mask"], capacity, training=False)
        unrouted = np.asarray(r.kept).sum(-1) == 0
        assert np.all(ya[unrouted] == 0) and np.all(yb[unrouted] == 0)
        assert np.all(np.isfinite(ya))
    finally:
        keras.mixed_precision.set_global_policy("float32")


def test_dispatch_plan_slots_are_unique_and_complete(rng):
    r = routing.TopKRouter(5, k=2).route(
        rng.normal(size=(2, 9, 5)).astype("float32"), np.ones((2, 9)), capacity=3
    )
    plan = dispatch_lib.GatherDispatcher().plan(r)
    slot_token = np.asarray(plan.slot_token)
    filled = slot_token[slot_token < 18]
    assert len(filled) == int(np.asarray(r.kept).sum())
    # A token can fill at most k=2 slots, and never two slots of one expert.
    tokens, counts = np.unique(filled, return_counts=True)
    assert counts.max() <= 2
