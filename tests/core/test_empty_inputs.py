"""Calls without real tokens: a batch of 0 sequences (what a replica gets under tf.distribute
when the batch is smaller than the replica count) or only padding.

They give outputs of 0, losses and router statistics of 0 (never NaN), finite gradients, and
leave the metric trackers' running means alone.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_moe
from keras_moe import routing
from keras_moe.layers.experts import FeedForwardExperts
from keras_moe.routing import losses as router_losses
from keras_moe.routing import metrics
from tests.core.reference import reference_moe

LENGTH, D_MODEL, NUM_EXPERTS = 4, 8, 4
ROUTERS = ("top1", "top1_batch_prioritized", "top2", "expert_choice")
DISPATCH = ("gather", "einsum", "dropless")
STAT_NAMES = set(metrics.SCALAR_METRICS) | {"expert_load", "selection_load", "num_tokens"}


def _router(kind):
    if kind == "top1":
        return routing.SwitchRouter(NUM_EXPERTS, seed=0)
    if kind == "top1_batch_prioritized":
        return routing.SwitchRouter(NUM_EXPERTS, batch_prioritized_routing=True, seed=0)
    if kind == "top2":
        return routing.Top2Router(NUM_EXPERTS, seed=0)  # "random" second expert in training
    return routing.ExpertChoiceRouter(NUM_EXPERTS, seed=0)


def _combinations(routers, group_sizes=None):
    """(router, dispatch[, group_size]) that the layer accepts (expert choice needs a capacity)."""
    pairs = [
        (r, d) for r in routers for d in DISPATCH if not (r == "expert_choice" and d == "dropless")
    ]
    if group_sizes is None:
        return pairs
    return [(r, d, g) for r, d in pairs for g in group_sizes]


def _layer(router, dispatch, group_size, **kwargs):
    layer = keras_moe.MoeLayer(
        _router(router),
        FeedForwardExperts(NUM_EXPERTS, 16, seed=0),
        group_size=group_size,
        pad_to_group_size=True,
        dispatch=dispatch,
        return_metrics=True,
        **kwargs,
    )
    layer.build((None, LENGTH, D_MODEL))
    return layer


def _step(layer, x, mask, training):
    """Outputs, statistics, the added losses and the gradients of all of them."""
    with tf.GradientTape() as tape:
        tape.watch(x)
        y, stats = layer(x, mask=mask, training=training)
        losses = list(layer.losses)
        total = tf.reduce_sum(y) + tf.add_n(losses)
    grads = tape.gradient(total, [x] + layer.trainable_weights)
    return y, stats, losses, grads


def _check_no_tokens(layer, x, mask, training=True, graph=False):
    def step(x, mask):
        return _step(layer, x, mask, training)

    if graph:  # the batch size unknown at trace time, as on a tf.distribute replica
        step = tf.function(
            step,
            input_signature=[tf.TensorSpec((None, LENGTH, D_MODEL)), tf.TensorSpec((None, LENGTH))],
        )
    y, stats, losses, grads = step(tf.constant(x), tf.constant(mask))
    assert tuple(y.shape) == x.shape
    np.testing.assert_array_equal(np.asarray(y), 0.0)
    assert len(losses) == 2  # aux and z
    np.testing.assert_array_equal([float(v) for v in losses], [0.0, 0.0])
    for name, value in stats.items():
        np.testing.assert_array_equal(np.asarray(value), 0.0, err_msg=name)
    for grad in grads:
        if grad is not None:
            np.testing.assert_array_equal(np.asarray(grad), 0.0)
    assert set(stats) == STAT_NAMES


@pytest.mark.parametrize(
    "router,dispatch,group_size", _combinations(ROUTERS, ["batch", "sequence", 3])
)
def test_empty_batch_eager(router, dispatch, group_size):
    layer = _layer(router, dispatch, group_size)
    x = np.zeros((0, LENGTH, D_MODEL), "float32")
    _check_no_tokens(layer, x, np.zeros((0, LENGTH), "float32"))


# (einsum refuses group_size="batch" here: its capacity is known at run time only.)
@pytest.mark.parametrize(
    "router,dispatch,group_size",
    [
        c
        for c in _combinations(["top2", "expert_choice"], ["batch", "sequence", 2])
        if c[1:] != ("einsum", "batch")
    ],
)
def test_empty_batch_in_a_graph_of_unknown_batch_size(router, dispatch, group_size):
    layer = _layer(router, dispatch, group_size)
    x = np.zeros((0, LENGTH, D_MODEL), "float32")
    _check_no_tokens(layer, x, np.zeros((0, LENGTH), "float32"), graph=True)


@pytest.mark.parametrize("graph", [False, True])
@pytest.mark.parametrize("group_size", ["batch", 3])
def test_empty_batch_routed_each_sequence_apart(group_size, graph):
    """route_each_sequence() (decoding, serving) on an empty batch: sequence groups, or
    each sequence cut into groups of 3 (the shapes must not be inferred from 0 rows)."""
    layer = _layer("top1", "gather", group_size)
    x = np.zeros((0, LENGTH, D_MODEL), "float32")
    with keras_moe.route_each_sequence():
        _check_no_tokens(layer, x, np.zeros((0, LENGTH), "float32"), training=False, graph=graph)


@pytest.mark.parametrize("router,dispatch", _combinations(ROUTERS))
def test_only_padding(router, dispatch, rng):
    layer = _layer(router, dispatch, "sequence")
    x = rng.normal(size=(2, LENGTH, D_MODEL)).astype("float32")
    _check_no_tokens(layer, x, np.zeros((2, LENGTH), "float32"), training=False)


def _switch_aux_loss(probs):
    """Switch load-balancing loss of one group of real tokens, in float64."""
    probs = np.asarray(probs, np.float64)
    fraction = np.bincount(probs.argmax(-1), minlength=probs.shape[-1]) / len(probs)
    return probs.shape[-1] * np.sum(fraction * probs.mean(0))


def test_aux_loss_is_the_mean_over_groups_with_tokens(rng):
    probs = rng.dirichlet(np.ones(3), size=(3, 5)).astype("float32")  # [G, S, E]
    mask = np.ones((3, 5), "float32")
    mask[1] = 0  # a group of padding only
    mask[2, 3:] = 0
    top1 = probs.argmax(-1)
    expected = (_switch_aux_loss(probs[0]) + _switch_aux_loss(probs[2, :3])) / 2
    loss = float(router_losses.load_balancing_loss(probs, top1, mask))
    np.testing.assert_allclose(loss, expected, rtol=1e-6)
    for size in (0, 3):  # no groups, or only padding
        assert (
            float(router_losses.load_balancing_loss(probs[:size], top1[:size], np.zeros((size, 5))))
            == 0.0
        )


@pytest.mark.parametrize("group_size", ["sequence", 4])
def test_a_sequence_of_padding_leaves_the_losses_of_the_others(rng, group_size):
    """[padding, real]: each group is one sequence; the losses are the real one's alone."""
    layer = keras_moe.MoeLayer(
        routing.SwitchRouter(NUM_EXPERTS, seed=0),
        FeedForwardExperts(NUM_EXPERTS, 16, init_scale=1.0, seed=0),
        group_size=group_size,
        dispatch="gather",
        eval_capacity_factor=1.0,
        min_expert_capacity=0,
    )
    x = rng.normal(size=(2, LENGTH, D_MODEL)).astype("float32")
    mask = np.array([[0] * LENGTH, [1] * LENGTH], "float32")
    y = np.asarray(layer(x, mask=mask))
    weights = {"router": np.asarray(layer.router.kernel.numpy())}
    weights.update({v.name: np.asarray(v.numpy()) for v in layer.experts.weights})
    expected, _, aux, z = reference_moe(x[1:], mask[1:], weights, 1, layer.capacity(LENGTH, False))
    np.testing.assert_allclose(y[1:], expected, rtol=2e-4, atol=2e-5)
    np.testing.assert_allclose([float(v) for v in layer.losses], [1e-2 * aux, 1e-3 * z], rtol=1e-5)


def test_router_statistics_without_tokens_are_zero():
    router = routing.Top2Router(NUM_EXPERTS, second_expert_policy="all")
    for shape in ((0, LENGTH), (2, LENGTH)):  # no groups, only padding
        logits = np.ones(shape + (NUM_EXPERTS,), "float32")
        mask = np.zeros(shape, "float32")
        stats = metrics.router_metrics(router.route(logits, mask, capacity=2), mask)
        for name, value in stats.items():
            np.testing.assert_array_equal(np.asarray(value), 0.0, err_msg=name)
    empty = np.zeros((0, LENGTH, D_MODEL), "float32")
    assert float(metrics.branch_rms_ratio(empty, empty, np.zeros((0, LENGTH)))) == 0.0


def test_metric_trackers_skip_calls_without_tokens(rng):
    layer = keras_moe.SwitchFeedForward(NUM_EXPERTS, 16, name="moe", seed=0)
    x = rng.normal(size=(2, LENGTH, D_MODEL)).astype("float32")
    layer(x)
    before = {name: float(t.result()) for name, t in layer._trackers.items()}
    layer(x[:0])
    layer(x, mask=np.zeros((2, LENGTH), "float32"))
    after = {name: float(t.result()) for name, t in layer._trackers.items()}
    assert after == before
    assert {float(t.count) for t in layer._trackers.values()} == {1.0}


def test_mirrored_fit_with_an_empty_replica_batch(two_cpu_strategy, rng):
    """3 sequences in batches of 2 over 2 replicas: the last step gives one replica none.

    With a learning rate of 0 the weights stay put, so the trackers must report
    the mean over the three one-sequence replica calls.
    """
    x = rng.normal(size=(3, LENGTH, D_MODEL)).astype("float32")
    y = rng.normal(size=(3, LENGTH, 1)).astype("float32")
    with two_cpu_strategy.scope():
        model = keras.Sequential(
            [
                keras.Input((LENGTH, D_MODEL)),
                keras_moe.SwitchFeedForward(
                    NUM_EXPERTS,
                    16,
                    group_size="sequence",
                    name="moe",
                    train_capacity_factor=1.0,
                    min_expert_capacity=0,
                    seed=0,
                ),
                keras.layers.Dense(1),
            ]
        )
        model.compile(keras.optimizers.SGD(0.0), "mse")
    history = model.fit(
        tf.data.Dataset.from_tensor_slices((x, y)).batch(2), shuffle=False, verbose=0
    ).history
    assert np.isfinite(history["loss"][0])
    probe = keras_moe.SwitchFeedForward.from_config(
        {**model.layers[0].get_config(), "return_metrics": True, "name": "probe"}
    )
    probe.build(x.shape)
    probe.set_weights(model.layers[0].get_weights())
    calls = [probe(x[i : i + 1], training=True)[1] for i in range(3)]
    for name in ("aux_loss", "z_loss", "dropped_fraction", "load_imbalance", "router_confidence"):
        expected = np.mean([float(stats[name]) for stats in calls])
        np.testing.assert_allclose(history[f"moe/{name}"][0], expected, rtol=1e-5, err_msg=name)
