"""The sequence-wise and global-batch balance losses on a JAX mesh, in a fresh process.

Run by tests/core/test_balance_losses.py; prints one "OK <check>" line per check.
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
from keras_moe.parallel import local_groups, sharding
from tests.core.balance_reference import loss64, routing64

assert keras.backend.backend() == "jax"
D, E, K = 8, 6, 2
rng = np.random.default_rng(0)


def _loss_on_mesh(balance_loss, x, mask):
    sharding.configure_mesh({"data": 4, "expert": 2}, num_experts=E)
    try:
        assert local_groups.batch_shards(x)[1] == 8  # each shard's sequence is its own group
        keras.utils.set_random_seed(0)  # a fixed router init (see test_balance_losses._layer)
        layer = keras_moe.TopKFeedForward(
            E,
            4,
            k=K,
            balance_loss=balance_loss,
            aux_loss_factor=1.0,
            z_loss_factor=0.0,
            track_metrics=False,
        )
        layer(x, mask=mask, training=True)
        return float(layer.losses[0]), np.asarray(layer.router.kernel.numpy())
    finally:
        sharding.clear_mesh()


def check_mesh(balance_loss):
    x = rng.normal(size=(8, 5, D)).astype("float32")
    mask = np.ones((8, 5), "float32")
    mask[3, 2:] = 0.0
    loss, kernel = _loss_on_mesh(balance_loss, x, mask)
    probs, counts = routing64(x, kernel, K)
    per_sequence = np.mean([loss64(probs[b], counts[b], mask[b]) for b in range(8)])
    whole = loss64(probs, counts, mask)
    assert abs(per_sequence - whole) > 1e-2
    expected = per_sequence if balance_loss == "sequence" else whole
    np.testing.assert_allclose(loss, expected, rtol=1e-5)
    print(f"OK mesh_{balance_loss}")


if __name__ == "__main__":
    check_mesh("sequence")
    check_mesh("global")
