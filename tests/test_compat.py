"""Each private internal keras_moe reaches through keras_moe.compat still behaves as assumed."""

import os
import subprocess
import sys
import threading

import keras
import numpy as np
import pytest
import tensorflow as tf

import gin
from keras_moe import compat


def test_the_environment_runs_the_tested_versions():
    assert compat.untested_versions() == []


def test_untested_versions_are_named():
    assert compat.untested_versions({"keras": "3.16.0", "tensorflow": "2.21.1"}) == [
        "keras 3.16.0 (tested: 3.15)"
    ]


class _Pair(keras.layers.Layer):
    def __init__(self):
        super().__init__()
        self.first = keras.layers.Dense(2)
        self.inner = keras.Sequential([keras.layers.Dropout(0.1, seed=3), keras.layers.Dense(1)])


def test_sublayers_direct_sublayers_and_seed_generators():
    pair = _Pair()
    found = compat.sublayers(pair)
    assert sorted(type(x).__name__ for x in found) == ["Dense", "Dense", "Dropout", "Sequential"]
    assert pair.inner.layers[1] in found and pair not in found  # nested, self left out
    assert compat.direct_sublayers(pair) == [pair.first, pair.inner]
    dropout = pair.inner.layers[0]
    generators = compat.seed_generators(dropout)
    assert len(generators) == 1 and isinstance(generators[0], keras.random.SeedGenerator)
    assert compat.seed_generators(pair.first) == []


class _LossLayer(compat.PerThreadLosses, keras.layers.Layer):
    def call(self, x):
        self.add_loss(ops_sum(x))
        return x


def ops_sum(x):
    return keras.ops.sum(x)


def test_per_thread_losses_keep_each_thread_apart():
    layer = _LossLayer()
    layer(np.ones((2,), "float32"))
    assert [float(v) for v in layer.losses] == [2.0]  # Keras reads what add_loss stored
    seen = {}
    barrier = threading.Barrier(2)

    def run(value):
        layer(np.full((3,), value, "float32"))
        barrier.wait()  # both threads have added their loss before either reads
        seen[value] = [float(v) for v in layer.losses]

    threads = [threading.Thread(target=run, args=(v,)) for v in (1.0, 10.0)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert seen == {1.0: [3.0], 10.0: [30.0]}


def test_variable_layout_round_trip():
    variable = keras.Variable(np.zeros((2, 2), "float32"))
    assert compat.variable_layout(variable) is None
    marker = object()
    compat.set_variable_layout(variable, marker)
    assert compat.variable_layout(variable) is marker


def test_learning_rate_schedule_is_the_schedule_not_its_value():
    schedule = keras.optimizers.schedules.ExponentialDecay(1.0, 10, 0.5)
    optimizer = keras.optimizers.SGD(learning_rate=schedule)
    assert compat.learning_rate_schedule(optimizer) is schedule
    assert float(compat.learning_rate_schedule(keras.optimizers.SGD(0.25))) == 0.25


def test_gin_macros_and_the_import_hook():
    gin.clear_config()
    try:
        gin.parse_config("COMPAT_TEST_MACRO = 7")
        assert "COMPAT_TEST_MACRO" in compat.gin_macro_names()
        assert compat.gin_macro_value("COMPAT_TEST_MACRO") == 7
        assert compat.gin_macro_references() == set()
        gin.parse_config("UNUSED = 1\nLISTED = [{'k': (%COMPAT_TEST_MACRO,)}]\nOUTER = %LISTED")
        assert compat.gin_macro_references() == {"COMPAT_TEST_MACRO", "LISTED"}
        modules = []
        with compat.gin_import_hook(lambda statement: modules.append(statement.module)):
            gin.parse_config("import json.decoder")
        assert modules == ["json.decoder"]
        gin.parse_config("import json")  # the hook is gone
        assert modules == ["json.decoder"]
    finally:
        gin.clear_config()


def test_gin_bindings_calls_and_the_binding_hook():
    import keras_moe.gin_config.model_configurables  # noqa: F401  (T5Config, SwitchFeedForward)

    gin.clear_config()
    try:
        seen = []

        def intercept(scope, selector, name, value):
            seen.append((scope, selector, name, value))
            return name == "moe_type"

        with compat.gin_binding_hook(intercept):
            gin.parse_config(
                "T5Config.moe_type = 'switch'\nenc/SwitchFeedForward.d_ff = 8\n"
                "T5Config.d_model = 16\nMACRO = 1"
            )
        assert seen == [
            ("", "T5Config", "moe_type", "switch"),
            ("enc", "SwitchFeedForward", "d_ff", 8),
            ("", "T5Config", "d_model", 16),
        ]
        assert compat.gin_bound_parameters() == {
            ("enc", "keras_moe.SwitchFeedForward"): ["d_ff"],
            ("", "keras_moe.models.T5Config"): ["d_model"],
        }  # moe_type was taken out
        gin.parse_config("T5Config.d_ff = 3")  # the hook is gone
        assert len(seen) == 3
        assert compat.gin_called_configurables() == set()
        gin.parse_config(
            "T5Config.sparse_ffn = @enc/SwitchFeedForward\nSwitchFeedForward.num_experts = 2"
        )
        gin.get_configurable("T5Config")()
        assert compat.gin_called_configurables() == {
            ("", "keras_moe.models.T5Config"),
            ("enc", "keras_moe.SwitchFeedForward"),
        }
    finally:
        gin.clear_config()


def test_tensorflow_internals():
    assert callable(compat.tf_xla_sharding().mesh_split)
    assert callable(compat.tf_tpu_ops().all_to_all)
    assert compat.tf_in_xla_context() is False
    inside = []

    @tf.function(jit_compile=True)
    def traced(x):
        inside.append(compat.tf_in_xla_context())
        return x + 1

    traced(tf.constant(1.0))
    assert inside == [True]
    from tensorflow.python.distribute import collective_all_reduce_strategy as cars

    before = cars.CollectiveAllReduceExtended._check_health_initial_timeout
    with compat.tf_collective_health_timeout(17):
        assert cars.CollectiveAllReduceExtended._check_health_initial_timeout == 17
    assert cars.CollectiveAllReduceExtended._check_health_initial_timeout == before


def test_layers_made_without_backend_state_leave_nothing_to_initialise():
    from keras.src.backend.common import global_state

    before = list(global_state.get_global_attribute("uninitialized_variables", []))
    with compat.without_backend_state():
        dropout = keras.layers.Dropout(0.5, seed=1)
    (generator,) = compat.seed_generators(dropout)
    assert generator.state._value is None  # never initialised
    assert global_state.get_global_attribute("uninitialized_variables", []) == before
    with keras.StatelessScope():  # a later scope initialises nothing of it on exit
        pass
    assert generator.state._value is None
    kept = keras.layers.Dropout(0.5, seed=1)  # outside, variables are made as usual
    assert int(compat.seed_generators(kept)[0].state.numpy()[0]) == 1


@pytest.mark.e2e
def test_a_model_config_with_a_sparse_ffn_leaves_tensorflow_unstarted():
    # Multi-worker training sets up TensorFlow's runtime after parsing gin (which
    # validates the sparse FFN by making one): it must not have started yet.
    code = (
        "import tensorflow as tf\n"
        "from keras_moe import compat\n"
        "from keras_moe.models import T5Config\n"
        "from functools import partial\n"
        "from keras_moe import SwitchFeedForward, GShardFeedForward\n"
        "T5Config(vocab_size=64, num_encoder_layers=2, num_decoder_layers=2,\n"
        "    sparse_ffn=partial(SwitchFeedForward, num_experts=4, d_ff=32,\n"
        "                       expert_dropout_rate=0.1, jitter_noise=0.1),\n"
        "    decoder_sparse_ffn=partial(GShardFeedForward, num_experts=4, d_ff=32))\n"
        "assert not compat.tf_runtime_started(), 'the runtime started'\n"
        "tf.config.set_logical_device_configuration(\n"
        "    tf.config.list_physical_devices('CPU')[0],\n"
        "    [tf.config.LogicalDeviceConfiguration()] * 2)\n"
        "print(len(tf.config.list_logical_devices('CPU')))\n"
    )
    env = {**os.environ, "KERAS_BACKEND": "tensorflow", "TF_CPP_MIN_LOG_LEVEL": "3"}
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip().splitlines()[-1] == "2"
