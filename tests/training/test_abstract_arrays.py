"""keras_moe.parallel.abstract_arrays: sharded abstract arrays of shapes and of variables.

The checks run with the JAX backend on 2 emulated CPU devices, in a subprocess
(the suite's own process runs the TensorFlow backend).
"""

import json
import os
import subprocess
import sys

import pytest

from tests.training.helpers import REPO

# Each test here starts a process.
pytestmark = pytest.mark.e2e

CHECKS = r"""
import doctest
import json

import jax

jax.config.update("jax_num_cpu_devices", 2)

import keras
import keras_moe
from keras_moe import sharding
from keras_moe.parallel import abstract_arrays

doc = doctest.testmod(abstract_arrays, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
distribution = sharding.configure_mesh({"data": 1, "expert": 2}, devices=jax.devices()[:2])
try:
    with keras.StatelessScope(initialize_variables=False):
        layer = keras_moe.MoeLayer(
            keras_moe.SwitchRouter(num_experts=4),
            keras_moe.FeedForwardExperts(num_experts=4, d_ff=8), group_size="sequence",
            dispatch="einsum", track_metrics=False)
        layer.build((2, 6, 16))
    weights = abstract_arrays.abstract_variables(layer.trainable_variables, distribution,
                                                 "bfloat16")
    state = abstract_arrays.abstract_variables(layer.non_trainable_variables, distribution)
    tokens = abstract_arrays.abstract_array((2, 6, 16), "float32", distribution.device_mesh,
                                            jax.sharding.PartitionSpec("expert"))
finally:
    sharding.clear_mesh()


def describe(s):
    return {"shape": list(s.shape), "dtype": str(s.dtype),
            "shard": list(s.sharding.shard_shape(s.shape))}


print("RESULT " + json.dumps({
    "doctest": [doc.attempted, doc.failed],
    "weights": {v.path: describe(s) for v, s in zip(layer.trainable_variables, weights)},
    "state": [describe(s) for s in state], "tokens": describe(tokens)}))
"""


def _run_checks():
    env = dict(
        os.environ,
        KERAS_BACKEND="jax",
        JAX_PLATFORMS="cpu",
        TF_CPP_MIN_LOG_LEVEL="3",
        PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""),
    )
    done = subprocess.run(
        [sys.executable, "-c", CHECKS],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    line = next(x for x in done.stdout.splitlines() if x.startswith("RESULT "))
    return json.loads(line[len("RESULT ") :])


def test_abstract_arrays_of_a_sharded_moe_layer():
    result = _run_checks()
    attempted, failed = result["doctest"]
    assert attempted > 0 and failed == 0, result["doctest"]
    weights = result["weights"]
    assert weights and all(w["dtype"] == "bfloat16" for w in weights.values())
    # The experts' stacked weights are split over the "expert" axis (4 experts, 2 per
    # device); every weight keeps its global shape.
    experts = [w for path, w in weights.items() if w["shape"][0] == 4 and len(w["shape"]) == 3]
    assert experts and all(w["shard"] == [2] + w["shape"][1:] for w in experts)
    # The router's weight is replicated.
    others = [w for w in weights.values() if w not in experts]
    assert others and all(w["shard"] == w["shape"] for w in others)
    # Variables keep their own dtype without one given; the seed state is replicated.
    assert result["state"] and all(s["shard"] == s["shape"] for s in result["state"])
    assert result["tokens"] == {"shape": [2, 6, 16], "dtype": "float32", "shard": [1, 6, 16]}
