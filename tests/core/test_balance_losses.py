"""Sequence-wise and global-batch balance losses, and MaxVio, against float64 NumPy."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_moe
from keras_moe.routing import losses as router_losses
from keras_moe.routing.metrics import router_metrics
from tests.core.balance_reference import loss64 as _loss64
from tests.core.balance_reference import routing64
from tests.core.helpers import run_jax_checks

D, E, K = 8, 6, 2  # tests/core/balance_jax_checks.py uses the same


def _layer(balance_loss, **kwargs):
    # A fixed router init: each test's "the notions differ" check compares two losses
    # of this router, which an unlucky draw can bring within the check's margin.
    keras.utils.set_random_seed(0)
    layer = keras_moe.TopKFeedForward(
        E,
        4,
        k=K,
        balance_loss=balance_loss,
        aux_loss_factor=1.0,
        z_loss_factor=0.0,
        track_metrics=False,
        **kwargs,
    )
    layer.build((None, None, D))
    return layer


def test_sequence_loss_is_the_mean_of_each_sequences_loss(rng):
    # "batch" groups mix the sequences position-major; the loss must still be per sequence.
    layer = _layer("sequence", group_size="batch")
    x = rng.normal(size=(3, 7, D)).astype("float32")
    mask = np.ones((3, 7), "float32")
    mask[1, 4:] = 0.0
    mask[2, :] = 0.0  # no real token: left out of the mean
    layer(x, mask=mask, training=True)
    probs, counts = routing64(x, layer.router.kernel.numpy(), K)
    expected = np.mean([_loss64(probs[b], counts[b], mask[b]) for b in (0, 1)])
    whole_batch = _loss64(probs, counts, mask)
    assert abs(expected - whole_batch) > 1e-2  # the two notions differ on this batch
    np.testing.assert_allclose(float(layer.losses[0]), expected, rtol=1e-5)


def test_global_loss_on_two_replicas_equals_the_concatenated_batch(rng, two_cpu_strategy):
    with two_cpu_strategy.scope():
        layer = _layer("global")
    x = rng.normal(size=(4, 5, D)).astype("float32")
    halves = [x[:2], x[2:]]

    @tf.function
    def per_replica_loss():
        inputs = two_cpu_strategy.experimental_distribute_values_from_function(
            lambda ctx: tf.constant(np.stack(halves))[ctx.replica_id_in_sync_group]
        )

        def step(replica_inputs):
            layer(replica_inputs, training=True)
            return tf.add_n(layer.losses)

        return two_cpu_strategy.run(step, args=(inputs,))

    losses = [float(v) for v in two_cpu_strategy.experimental_local_results(per_replica_loss())]
    probs, counts = routing64(x, layer.router.kernel.numpy(), K)
    ones = np.ones((4, 5))
    expected = _loss64(probs, counts, ones)
    # Keras averages the replicas' losses: the mean is the whole batch's loss.
    np.testing.assert_allclose(np.mean(losses), expected, rtol=1e-5)
    # Each replica counting only its own choices would give another loss.
    local = np.mean([_loss64(probs[i : i + 2], counts[i : i + 2], ones[i : i + 2]) for i in (0, 2)])
    assert abs(local - expected) > 1e-3


def test_global_loss_in_one_process_is_the_whole_batch_loss(rng):
    layer = _layer("global", group_size=5)
    x = rng.normal(size=(2, 5, D)).astype("float32")
    mask = np.array([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]], "float32")
    layer(x, mask=mask, training=True)
    probs, counts = routing64(x, layer.router.kernel.numpy(), K)
    np.testing.assert_allclose(float(layer.losses[0]), _loss64(probs, counts, mask), rtol=1e-5)


def test_balance_losses_are_one_for_a_uniform_router():
    probs = np.full((2, 4, 4), 0.25, "float32")
    counts = np.tile(np.eye(4, dtype="float32")[None], (2, 1, 1))  # each expert once
    mask = np.ones((2, 4))
    assert float(router_losses.sequence_balance_loss(probs, counts, mask)) == pytest.approx(1.0)
    assert float(router_losses.global_balance_loss(probs, counts, mask)) == pytest.approx(1.0)


def test_max_violation_counts_every_choice_before_capacity():
    router = keras_moe.TopKRouter(3, k=2)
    # Choices per token (best first): {0, 1}, {0, 2}, {0, 1}, {0, 1}; the 5th is padding.
    probs = np.array(
        [[[0.6, 0.3, 0.1], [0.6, 0.1, 0.3], [0.5, 0.4, 0.1], [0.7, 0.2, 0.1], [0.1, 0.1, 0.8]]]
    )
    mask = np.array([[1.0, 1.0, 1.0, 1.0, 0.0]])
    routing = router.route(np.log(probs).astype("float32"), mask, capacity=1)  # drops most
    stats = router_metrics(routing, mask)
    # loads 4, 3, 1: max over the mean 8/3, minus 1
    assert float(stats["max_violation"]) == pytest.approx(4 / (8 / 3) - 1, rel=1e-6)
    assert float(stats["dropped_fraction"]) > 0  # capacity cut, MaxVio did not see it


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(balance_loss="token"), "`balance_loss` must be one of"),
        (dict(shared_expert_gate=True), "`shared_expert_gate=True` needs a shared expert"),
    ],
)
def test_invalid_arguments_are_named(kwargs, message):
    with pytest.raises(ValueError, match=message):
        keras_moe.TopKFeedForward(E, 4, **kwargs)


def test_expert_choice_refuses_a_token_balance_loss():
    with pytest.raises(ValueError, match="needs a token-choice router"):
        keras_moe.MoeLayer(
            keras_moe.ExpertChoiceRouter(4),
            keras_moe.FeedForwardExperts(4, 8),
            balance_loss="sequence",
        )


def test_sequence_loss_trains_under_fit(rng):
    inputs = keras.Input((6, D))
    layer = keras_moe.TopKFeedForward(E, 4, k=K, balance_loss="sequence", track_metrics=False)
    model = keras.Model(inputs, inputs + layer(inputs))
    model.compile("adam", "mse")
    x = rng.normal(size=(4, 6, D)).astype("float32")
    before = layer.router.kernel.numpy().copy()
    history = model.fit(x, x, epochs=1, verbose=0).history
    assert np.isfinite(history["loss"][0])
    assert not np.allclose(layer.router.kernel.numpy(), before)


@pytest.mark.e2e
def test_balance_losses_on_a_jax_mesh():
    # The batch split over 4 x 2 devices: groups stay on their shard, the losses do not.
    run_jax_checks("balance_jax_checks.py", ["mesh_sequence", "mesh_global"])
