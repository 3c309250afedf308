"""Batch-wide routing groups: causal safety, run-time batch sizes, and the refusals."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_moe
from keras_moe import routing


def _switch(**kwargs):
    kwargs.setdefault("min_expert_capacity", 0)
    return keras_moe.SwitchFeedForward(num_experts=4, d_ff=16, seed=0, **kwargs)


def test_batch_groups_are_causal_in_position(rng):
    """A token's output never depends on tokens at later positions, of any sequence,
    even when capacity is short enough to drop tokens."""
    layer = _switch(eval_capacity_factor=0.5, causal=True)
    x = rng.normal(size=(4, 10, 8)).astype("float32")
    y = np.asarray(layer(x, training=False))
    assert np.any(np.all(y == 0, axis=-1)), "capacity must be short enough to drop tokens"
    for t in (3, 6):
        changed = x.copy()
        changed[:, t + 1 :] = rng.normal(size=changed[:, t + 1 :].shape)
        y_changed = np.asarray(layer(changed, training=False))
        np.testing.assert_allclose(y_changed[:, : t + 1], y[:, : t + 1], rtol=1e-5, atol=1e-6)


def test_sequence_major_batch_order_would_not_be_causal(rng):
    """The same check fails for position-independent grouping across sequences,
    so the test above can tell causal from non-causal grouping."""
    leaked = []
    for seed in range(5):
        keras.utils.set_random_seed(seed)
        layer = _switch(eval_capacity_factor=0.5, group_size=40)  # 4 x 10 tokens, sequence-major
        x = rng.normal(size=(4, 10, 8)).astype("float32")
        y = np.asarray(layer(x, training=False))
        changed = x.copy()
        changed[0, 4:] = rng.normal(size=changed[0, 4:].shape)  # later positions of sequence 0
        y_changed = np.asarray(layer(changed, training=False))
        leaked.append(not np.allclose(y_changed[1:, :4], y[1:, :4], atol=1e-6))
    assert any(leaked)


@pytest.mark.parametrize(
    "make",
    [
        lambda: _switch(train_capacity_factor=0.75),
        lambda: keras_moe.GShardFeedForward(
            num_experts=4,
            d_ff=16,
            train_capacity_factor=0.5,
            min_expert_capacity=0,
            second_expert_policy="all",
        ),
        lambda: keras_moe.MoeLayer(
            routing.ExpertChoiceRouter(4),
            keras_moe.FeedForwardExperts(4, 16),
            min_expert_capacity=0,
            train_capacity_factor=0.5,
        ),
    ],
    ids=["switch", "gshard", "expert_choice"],
)
def test_unknown_batch_size_routes_the_same_as_a_known_one(rng, make):
    """`fit` on arrays traces with batch size None: capacity is then computed at run time."""
    layer = make()
    x = rng.normal(size=(3, 8, 8)).astype("float32")
    static = np.asarray(layer(x, training=True))
    assert np.any(np.all(static == 0, axis=-1)), "some tokens must be dropped"

    @tf.function(input_signature=[tf.TensorSpec([None, 8, 8])])
    def dynamic(t):
        return layer(t, training=True)

    np.testing.assert_allclose(dynamic(tf.constant(x)).numpy(), static, rtol=1e-6, atol=1e-7)
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(dynamic(tf.constant(x)) ** 2)
    grads = tape.gradient(loss, layer.trainable_variables)
    assert all(g is not None and np.all(np.isfinite(g.numpy())) for g in grads)


def test_einsum_with_unknown_batch_size_names_the_fix(rng):
    layer = _switch(dispatch="einsum")
    layer(rng.normal(size=(2, 8, 8)).astype("float32"))

    @tf.function(input_signature=[tf.TensorSpec([None, 8, 8])])
    def dynamic(t):
        return layer(t)

    with pytest.raises(ValueError, match="static expert capacity"):
        dynamic(tf.zeros((2, 8, 8)))


@pytest.mark.parametrize("group_size", ["batch", "sequence", 8, 16])
def test_one_token_calls_route_each_token_alone(rng, group_size):
    """Cached decoding feeds one token per sequence: never over capacity, whatever
    the group size (groups of 8 one-token rows dropped 12.5 % of them)."""
    layer = _switch(eval_capacity_factor=0.25, group_size=group_size, return_metrics=True)
    x = rng.normal(size=(16, 1, 8)).astype("float32")
    y, stats = layer(x, training=False)
    assert not np.any(np.all(np.asarray(y) == 0, axis=-1))
    assert float(stats["dropped_fraction"]) == 0.0


def _alone_and_together(layer, x):
    with keras_moe.route_each_sequence():
        alone = [np.asarray(layer(x[i : i + 1], training=False))[0] for i in range(len(x))]
        together = np.asarray(layer(x, training=False))
    return np.stack(alone), together


@pytest.mark.parametrize("group_size", ["batch", 4, 5, 12])
def test_route_each_sequence_keeps_sequences_apart(rng, group_size):
    """Inside the scope a sequence's outputs do not depend on the rest of the batch
    (capacity short enough to drop); outside it, batch-wide groups do mix them."""
    layer = _switch(
        eval_capacity_factor=0.5,
        min_expert_capacity=1,
        group_size=group_size,
        pad_to_group_size=True,
    )
    x = rng.normal(size=(4, 10, 8)).astype("float32")
    alone, together = _alone_and_together(layer, x)
    assert np.any(np.all(together == 0, axis=-1)), "capacity must drop tokens"
    np.testing.assert_allclose(together, alone, rtol=1e-5, atol=1e-6)
    if group_size in ("batch", 12):
        assert not np.allclose(np.asarray(layer(x, training=False)), together, atol=1e-6)


def test_route_each_sequence_cuts_sequences_into_integer_groups(rng):
    """group_size=5 on 10-token sequences: two groups of 5 per sequence, each with
    the capacity of 5 tokens, exactly as "sequence" routing of the two halves."""
    layer = _switch(eval_capacity_factor=0.5, min_expert_capacity=1, group_size=5)
    x = rng.normal(size=(3, 10, 8)).astype("float32")
    with keras_moe.route_each_sequence():
        y = np.asarray(layer(x, training=False))
    halves = np.asarray(layer(x.reshape(6, 5, 8), training=False)).reshape(3, 10, 8)
    np.testing.assert_allclose(y, halves, rtol=1e-5, atol=1e-6)


def test_batch_prioritized_routing_is_refused_in_causal_layers():
    with pytest.raises(ValueError, match="batch_prioritized_routing"):
        keras_moe.SwitchFeedForward(
            num_experts=4, d_ff=8, causal=True, batch_prioritized_routing=True
        )
    keras_moe.SwitchFeedForward(num_experts=4, d_ff=8, batch_prioritized_routing=True)


@pytest.mark.parametrize("bad", ["batches", 0, True, 2.5])
def test_bad_group_size_names_the_argument(bad):
    with pytest.raises(ValueError, match="group_size"):
        keras_moe.SwitchFeedForward(num_experts=4, d_ff=8, group_size=bad)
