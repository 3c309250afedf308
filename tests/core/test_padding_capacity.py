"""Padding takes no capacity: a group's capacity counts its real tokens only."""

import numpy as np
import pytest

import keras_moe
from keras_moe import routing

ROUTERS = {
    "switch": lambda: routing.SwitchRouter(8, seed=0),
    "top2_after_capacity": lambda: routing.Top2Router(
        8, second_expert_policy="all", normalize_gates="after_capacity", seed=0
    ),
    "top3": lambda: routing.TopKRouter(8, k=3, seed=0),
    "expert_choice": lambda: routing.ExpertChoiceRouter(8, seed=0),
}


def _layer(router, dispatch, **kwargs):
    kwargs.setdefault("eval_capacity_factor", 0.25)
    kwargs.setdefault("min_expert_capacity", 1)
    return keras_moe.MoeLayer(
        ROUTERS[router](),
        keras_moe.FeedForwardExperts(8, d_ff=32, seed=0),
        dispatch=dispatch,
        **kwargs,
    )


@pytest.mark.parametrize("dispatch", ["einsum", "gather"])
@pytest.mark.parametrize("router", sorted(ROUTERS))
def test_a_sequence_routes_the_same_alone_padded_or_beside_a_longer_one(rng, router, dispatch):
    """20 real tokens: alone, padded to 64, and padded beside a 64-token sequence. With a
    capacity short enough to drop tokens, the padded group's 64 positions would give its
    experts more slots than its 20 tokens do."""
    layer = _layer(router, dispatch, group_size="sequence")
    x = rng.normal(size=(1, 20, 16)).astype("float32")
    longer = rng.normal(size=(1, 64, 16)).astype("float32")
    padded = np.concatenate([x, np.zeros((1, 44, 16), "float32")], axis=1)
    mask = np.concatenate([np.ones((1, 20)), np.zeros((1, 44))], axis=1).astype("float32")
    alone = np.asarray(layer(x))
    assert np.any(np.all(alone == 0, axis=-1)), "capacity must be short enough to drop tokens"
    padded_alone = np.asarray(layer(padded, mask=mask))
    together = np.asarray(
        layer(
            np.concatenate([padded, longer]),
            mask=np.concatenate([mask, np.ones((1, 64), "float32")]),
        )
    )
    # Only float round-off apart (other buffer shapes); a token given a slot it would not
    # have alone moves its output by O(1).
    np.testing.assert_allclose(padded_alone[:, :20], alone, atol=1e-6)
    np.testing.assert_allclose(together[:1, :20], alone, atol=1e-6)
    assert np.all(padded_alone[:, 20:] == 0)


@pytest.mark.parametrize("dispatch", ["einsum", "gather"])
def test_batch_groups_count_real_tokens_only(rng, dispatch):
    """`group_size="batch"` inside route_each_sequence(), and integer groups padded up to
    their size, give the same outputs as the unpadded sequence."""
    x = rng.normal(size=(2, 12, 16)).astype("float32")
    for group_size in ("batch", 16):
        # 0.6 * 12 / 8 rounds up to 1 slot, 0.6 * 16 / 8 (or 21) to 2.
        layer = _layer(
            "switch",
            dispatch,
            group_size=group_size,
            pad_to_group_size=True,
            eval_capacity_factor=0.6,
        )
        alone = np.asarray(layer(x[:1], training=False)) if group_size == "batch" else None
        with keras_moe.route_each_sequence():
            padded = np.concatenate([x[:1], np.zeros((1, 9, 16), "float32")], axis=1)
            mask = np.r_[np.ones(12), np.zeros(9)][None].astype("float32")
            routed = np.asarray(layer(padded, mask=mask))[:, :12]
            plain = np.asarray(layer(x[:1]))
        np.testing.assert_allclose(routed, plain, atol=1e-6)
        if alone is not None:
            np.testing.assert_allclose(plain, alone, atol=1e-6)


@pytest.mark.parametrize("dispatch", ["einsum", "gather"])
@pytest.mark.parametrize("router", ["switch", "top2_after_capacity"])
def test_an_unpadded_batch_trains_exactly_as_without_a_mask(rng, router, dispatch):
    """All-real masks take the real-token path; it must change nothing, bit for bit."""
    x = rng.normal(size=(3, 16, 16)).astype("float32")
    layer = _layer(router, dispatch, group_size="batch", train_capacity_factor=0.5)
    without = np.asarray(layer(x, training=True))
    losses_without = [float(v) for v in layer.losses]
    with_mask = np.asarray(layer(x, mask=np.ones((3, 16), "float32"), training=True))
    assert np.any(np.all(without == 0, axis=-1)), "capacity must be short enough to drop tokens"
    np.testing.assert_array_equal(with_mask, without)
    assert [float(v) for v in layer.losses] == losses_without


def test_real_token_capacity_follows_the_capacity_formula():
    """ceil(cf * k * n / E) slots for n real tokens, at least the minimum, at most n."""
    layer = keras_moe.GShardFeedForward(
        num_experts=8, d_ff=8, train_capacity_factor=1.25, min_expert_capacity=2
    )
    mask = np.zeros((4, 40), "float32")
    for g, n in enumerate((40, 17, 1, 0)):
        mask[g, :n] = 1
    # 40 tokens: ceil(1.25 * 2 * 40 / 8) = 13; 17: ceil(5.3125) = 6; 1: min 2, at most 1.
    assert np.asarray(layer.real_token_capacity(mask, 40, training=True)).tolist() == [13, 6, 1, 0]
