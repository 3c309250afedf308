"""Logical axis rules, the variable table and the no-mesh path (TF backend, in process)."""

import numpy as np
import pytest

import keras_moe
from keras_moe.layers.expert_parallel import ExpertParallelExperts
from keras_moe.layers.experts import FeedForwardExperts
from keras_moe.parallel import layouts, sharding

MESH = {"data": 2, "expert": 4, "model": 1}


def test_no_mesh_is_identity():
    x = np.ones((2, 3, 4), "float32")
    assert sharding.get_logical_axis_rules() is None
    assert sharding.with_logical_constraint(x, ("batch", "length", "embed")) is x
    # Unknown tags cost nothing without a mesh either.
    assert sharding.with_logical_constraint(x, ("nonsense", None, None)) is x


def test_rules_on_tf_backend_without_spmd_are_no_op():
    x = np.ones((4, 2, 3, 8), "float32")
    sharding.set_logical_axis_rules(layouts.DEFAULT_RULES)
    try:
        assert sharding.with_logical_constraint(x, ("expert", "batch", None, "embed")) is x
    finally:
        sharding.set_logical_axis_rules(None)


@pytest.mark.parametrize(
    "axes,mesh,shape,expected",
    [
        (("expert", "batch", None, "embed"), MESH, None, ("expert", "data", None, None)),
        (("batch", "length", "embed"), MESH, None, (("data", "expert"), None, None)),
        (
            ("batch", "length", "embed"),
            {"data": 1, "expert": 8, "model": 1},
            None,
            ("expert", None, None),
        ),
        (
            ("expert", "embed", "mlp"),
            {"data": 1, "expert": 4, "model": 2},
            None,
            ("expert", None, "model"),
        ),
        # 6 groups cannot be split 8 ways: fall back to "data".
        (("batch", "length", "embed"), MESH, (6, 4, 8), ("data", None, None)),
        (("vocab", "embed"), {"data": 2, "expert": 2, "model": 2}, None, ("model", None)),
    ],
)
def test_logical_to_mesh_axes(axes, mesh, shape, expected):
    assert layouts.logical_to_mesh_axes(axes, layouts.DEFAULT_RULES, mesh, shape) == expected


def test_rule_order_gives_priority():
    rules = (("batch", ("data", "expert")), ("expert", "expert"), ("batch", "data"))
    # batch takes "expert" first, so the expert dim stays replicated.
    assert layouts.logical_to_mesh_axes(("expert", "batch"), rules, MESH) == (
        None,
        ("data", "expert"),
    )


@pytest.mark.parametrize(
    "path,rank,expected",
    [
        ("moe/experts/wi", 3, ("expert", "embed", "mlp")),
        ("encoder_layer_1/ffn/experts/wi_0", 3, ("expert", "embed", "mlp")),
        ("encoder_layer_1/ffn/experts/wo", 3, ("expert", "mlp", "embed")),
        ("encoder_layer_1/ffn/router/kernel", 2, ("embed", None)),
        ("token_embedding/embeddings", 2, ("vocab", "embed")),
        ("encoder_layer_0/attention/query", 2, ("embed", "heads")),
        ("decoder_layer_0/cross_attention/value", 2, ("embed", "heads")),
        ("decoder_layer_0/self_attention/output", 2, ("heads", "embed")),
        ("mha/attention_output/kernel", 3, ("heads", "kv", "embed")),
        ("encoder_layer_0/ffn/wi_1", 2, ("embed", "mlp")),
        ("encoder_layer_0/ffn/wo", 2, ("mlp", "embed")),
        ("lm_head/kernel", 2, ("embed", "vocab")),
        ("encoder_position_bias/embeddings", 2, (None, "heads")),
        ("encoder_norm/scale", 1, None),
        ("dense/kernel", 2, None),
    ],
)
def test_variable_table(path, rank, expected):
    assert layouts.variable_logical_axes(path, rank) == expected


def test_variable_table_is_extendable():
    try:
        layouts.register_variable_axes(r".*my_proj/kernel", ("embed", "mlp"))
        layouts.register_variable_axes(r".*experts/wi", ("expert", None, None))
        assert layouts.variable_logical_axes("blk/my_proj/kernel", 2) == ("embed", "mlp")
        assert layouts.variable_logical_axes("moe/experts/wi", 3) == ("expert", None, None)
        with pytest.raises(ValueError, match="Unknown logical axis 'hidden'"):
            layouts.register_variable_axes(r".*x", ("hidden",))
    finally:
        layouts.reset_variable_axes()
    assert layouts.variable_logical_axes("blk/my_proj/kernel", 2) is None


@pytest.mark.parametrize(
    "kwargs,needle",
    [
        (dict(mesh_shape={"data": 2, "expert": 2}, num_devices=8), "4 devices but 8 devices"),
        (dict(mesh_shape={"expert": 4}, num_experts=6), "`num_experts`=6 is not divisible"),
        (
            dict(mesh_shape={"expert": 4}, rules=(("experts", "expert"),)),
            "Unknown logical axis 'experts'",
        ),
        (dict(mesh_shape={"expert": 4}, rules=(("expert", "tensor"),)), "mesh axis 'tensor'"),
        (dict(mesh_shape={"tensor": 4}), "Unknown mesh axis 'tensor'"),
        (dict(mesh_shape={"expert": 0}), "must be an integer >= 1"),
        (dict(mesh_shape=[4]), "`mesh_shape` must be a dict"),
    ],
)
def test_validate_mesh_errors(kwargs, needle):
    with pytest.raises(ValueError, match=needle.replace("(", r"\(").replace("`", "`")):
        sharding.validate_mesh(**kwargs)


def test_validate_mesh_fills_missing_axes():
    shape, rules = sharding.validate_mesh({"expert": 8}, num_devices=8, num_experts=16)
    assert shape == {"data": 1, "expert": 8, "model": 1}
    assert rules == layouts.DEFAULT_RULES


def test_configure_mesh_refuses_tensorflow_backend():
    import keras

    n = len(keras.distribution.list_devices())
    with pytest.raises(ValueError, match="needs the JAX backend"):
        sharding.configure_mesh({"data": n})
    assert sharding.get_logical_axis_rules() is None


def test_tpu_spmd_annotations_reach_the_hlo():
    """On CPU XLA ignores them, so only their presence is checked here."""
    import tensorflow as tf

    layer = keras_moe.SwitchFeedForward(
        num_experts=4,
        d_ff=8,
        dispatch="einsum",
        min_expert_capacity=2,
        track_metrics=False,
        group_size="sequence",
    )
    x = tf.constant(np.random.RandomState(0).randn(8, 4, 8).astype("float32"))
    layer(x)
    fn = tf.function(lambda t: layer(t), jit_compile=True)
    plain = fn.experimental_get_compiler_ir(x)(stage="hlo")
    sharding.configure_tpu_spmd({"data": 2, "expert": 2})
    try:
        fn = tf.function(lambda t: layer(t), jit_compile=True)
        annotated = fn.experimental_get_compiler_ir(x)(stage="hlo")
    finally:
        sharding.clear_mesh()
    assert "sharding=" not in plain
    # Expert buffers [E, G, C, d]: tokens first (G over 4 devices), then experts.
    assert "sharding={devices=[1,4,1,1]" in annotated
    assert "sharding={devices=[2,2,1,1]" in annotated
    # Combined tokens [G, S, d] over both axes.
    assert "sharding={devices=[4,1,1]" in annotated
    assert sharding.get_logical_axis_rules() is None


def test_expert_parallel_falls_back_without_replicas():
    rs = np.random.RandomState(0)
    x = rs.randn(4, 2, 3, 8).astype("float32")
    plain = FeedForwardExperts(4, 16, activation="gated-gelu")
    parallel = ExpertParallelExperts(4, 16, activation="gated-gelu")
    plain.build(x.shape)
    parallel.build(x.shape)
    parallel.set_weights(plain.get_weights())
    np.testing.assert_array_equal(np.asarray(parallel(x)), np.asarray(plain(x)))
    assert parallel.local_experts == 4
    config = parallel.get_config()
    assert config["exchange"] == "auto"
    assert ExpertParallelExperts.from_config(config).exchange == "auto"
    with pytest.raises(ValueError, match="`exchange` must be one of"):
        ExpertParallelExperts(4, 16, exchange="ring")
