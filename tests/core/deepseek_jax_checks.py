"""DeepSeek-V3 routing on the JAX backend, in a fresh process (8 host CPU devices).

Run by tests/core/test_deepseek_routing.py; prints one "OK <check>" line per check.
"""

import os
import sys

os.environ["KERAS_BACKEND"] = "jax"
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
)
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import keras
import numpy as np

import keras_moe
from keras_moe.parallel import sharding
from tests.core import deepseek_reference as reference

assert keras.backend.backend() == "jax"
D, E, K, N_GROUP, TOPK_GROUP, RATE = 16, 16, 4, 4, 2, 0.0625
rng = np.random.default_rng(0)


def _router(**kwargs):
    return keras_moe.TopKRouter(
        E,
        k=K,
        score_function="sigmoid",
        normalize_top_k=True,
        routed_scaling_factor=2.5,
        n_group=N_GROUP,
        topk_group=TOPK_GROUP,
        selection_bias=True,
        **kwargs,
    )


def check_hf_selection():
    router = _router()
    router.build((None, None, D))
    bias = rng.normal(0, 0.3, size=(E,)).astype("float32")
    router.expert_bias.assign(bias)
    x = rng.normal(size=(3, 10, D)).astype("float32")
    routing = router.route(router(x), np.ones((3, 10)), capacity=10)
    kernel = np.asarray(router.kernel.numpy(), "float64")
    scores = reference.sigmoid(x.reshape(-1, D) @ kernel)
    want = reference.select(scores, bias, K, N_GROUP, TOPK_GROUP)
    got = np.asarray(routing.expert_index).reshape(-1, K)
    np.testing.assert_array_equal(np.sort(got, -1), np.sort(want, -1))
    weight = np.take_along_axis(scores, got, -1)
    weight = 2.5 * weight / weight.sum(-1, keepdims=True)
    np.testing.assert_allclose(
        np.asarray(routing.combine_weight).reshape(-1, K), weight, rtol=1e-5, atol=1e-5
    )
    print("OK hf_selection")


def _fit_model(batch):
    router = _router(bias_update_rate=RATE)
    layer = keras_moe.MoeLayer(
        router,
        keras_moe.FeedForwardExperts(E, 8),
        group_size="sequence",
        dispatch="gather",
        train_capacity_factor=float(E),
        eval_capacity_factor=float(E),
        track_metrics=False,
    )
    inputs = keras.Input((6, D), batch_size=batch)
    model = keras.Model(inputs, layer(inputs))
    model.compile(optimizer=keras.optimizers.SGD(0.0), loss="mse")  # the kernel stays fixed
    return model, router


def _check_three_steps(batch):
    model, router = _fit_model(batch)
    x = rng.normal(size=(batch, 6, D)).astype("float32")
    y = rng.normal(size=(batch, 6, D)).astype("float32")
    history, counts = reference.bias_sequence(
        x, np.asarray(router.kernel.numpy(), "float64"), K, N_GROUP, TOPK_GROUP, RATE, 3
    )
    assert not np.array_equal(counts[0], counts[1])
    model.fit(
        np.concatenate([x] * 3), np.concatenate([y] * 3), batch_size=batch, shuffle=False, verbose=0
    )
    np.testing.assert_allclose(np.asarray(router.expert_bias.numpy()), history[-1], atol=1e-6)
    model.evaluate(x, y, batch_size=batch, verbose=0)
    model.predict(x, batch_size=batch, verbose=0)
    np.testing.assert_allclose(np.asarray(router.expert_bias.numpy()), history[-1], atol=1e-6)
    return x, router


def check_fit_bias():
    _check_three_steps(4)
    print("OK fit_bias")


def check_mesh_bias():
    sharding.configure_mesh({"data": 4, "expert": 2}, num_experts=E)
    try:
        x, router = _check_three_steps(8)
    finally:
        sharding.clear_mesh()
    # One data shard alone (2 sequences) would have moved the bias elsewhere.
    local, _ = reference.bias_sequence(
        x[:2], np.asarray(router.kernel.numpy(), "float64"), K, N_GROUP, TOPK_GROUP, RATE, 3
    )
    assert not np.allclose(local[-1], np.asarray(router.expert_bias.numpy()))
    print("OK mesh_bias")


if __name__ == "__main__":
    check_hf_selection()
    check_fit_bias()
    check_mesh_bias()
