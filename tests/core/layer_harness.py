"""One check for every registered keras_moe layer, in the spirit of keras-hub's `run_layer_test`.

`CASES` maps each registered layer's name ("keras_moe>Class", or
"keras_moe>Class:configuration" for further configurations of one class) to
how to build and call a small instance and what it must produce. `check_layer` then checks,
on whichever backend runs it: output shapes, trainable / non-trainable weight
counts, `get_config` -> `from_config` giving an equal config and the same
outputs with the same weights, and a `.keras` round trip of a model holding the
layer, loaded in safe mode, giving the same outputs; under `mixed_bfloat16`,
float32 weights and routers and outputs close to float32's; and one training
step that moves every trainable weight. `test_layer_harness.py` runs it on
TensorFlow, and the same cases on JAX in a subprocess.
"""

import dataclasses
import os
import tempfile
from typing import Callable

import keras
import numpy as np

import keras_moe
from keras_moe import compat, routing
from keras_moe.layers import expert_parallel
from keras_moe.layers.dense_feedforward import DenseFeedForward
from keras_moe.models.attention import T5Attention
from keras_moe.models.blocks import DecoderBlock, EncoderBlock
from keras_moe.models.normalization import RMSNorm
from keras_moe.models.position_bias import RelativePositionBias
from keras_moe.routing.base import Router

D = 16  # d_model of every case


@dataclasses.dataclass
class Case:
    build: Callable  # () -> layer
    inputs: Callable  # rng -> list of positional numpy inputs (batch axis first)
    output_shape: tuple
    trainable_weights: int
    non_trainable_weights: int = 0
    backends: tuple = ("tensorflow", "jax")


def _tokens(rng, *shape):
    return rng.normal(size=shape).astype("float32")


CASES = {
    "keras_moe>FeedForwardExperts": Case(
        lambda: keras_moe.FeedForwardExperts(4, 8, activation="gated-gelu"),
        lambda rng: [_tokens(rng, 4, 2, 3, D)],
        (4, 2, 3, D),
        3,
    ),
    # tf.distribute expert parallelism: a TensorFlow-only class (JAX shards with a mesh).
    "keras_moe>ExpertParallelExperts": Case(
        lambda: expert_parallel.ExpertParallelExperts(4, 8),
        lambda rng: [_tokens(rng, 4, 2, 3, D)],
        (4, 2, 3, D),
        2,
        backends=("tensorflow",),
    ),
    "keras_moe>TopKRouter": Case(
        lambda: routing.TopKRouter(4, k=3, use_bias=True),
        lambda rng: [_tokens(rng, 2, 5, D)],
        (2, 5, 4),
        2,
    ),
    # DeepSeek-V3 routing: sigmoid scores, group-limited top-k, scaled weights and
    # the loss-free balancing bias (one non-trainable weight, moved by training).
    "keras_moe>TopKRouter:deepseek_v3": Case(
        lambda: routing.TopKRouter(
            8,
            k=2,
            score_function="sigmoid",
            normalize_top_k=True,
            routed_scaling_factor=2.5,
            n_group=4,
            topk_group=2,
            selection_bias=True,
            bias_update_rate=1e-3,
        ),
        lambda rng: [_tokens(rng, 2, 5, D)],
        (2, 5, 8),
        1,
        1,
    ),
    "keras_moe>SwitchRouter": Case(
        lambda: routing.SwitchRouter(4, jitter_noise=0.1),
        lambda rng: [_tokens(rng, 2, 5, D)],
        (2, 5, 4),
        1,
    ),
    "keras_moe>Top2Router": Case(
        lambda: routing.Top2Router(
            4, second_expert_policy="threshold", second_expert_threshold=0.2
        ),
        lambda rng: [_tokens(rng, 2, 5, D)],
        (2, 5, 4),
        1,
    ),
    "keras_moe>ExpertChoiceRouter": Case(
        lambda: routing.ExpertChoiceRouter(4), lambda rng: [_tokens(rng, 2, 5, D)], (2, 5, 4), 1
    ),
    "keras_moe>MoeLayer": Case(
        lambda: keras_moe.MoeLayer(
            routing.Top2Router(4),
            keras_moe.FeedForwardExperts(4, 8),
            group_size="sequence",
            dispatch="dropless",
            track_metrics=False,
        ),
        lambda rng: [_tokens(rng, 2, 6, D)],
        (2, 6, D),
        3,
    ),
    "keras_moe>MoeLayer:deepseek_v3": Case(
        lambda: keras_moe.MoeLayer(
            routing.TopKRouter(
                8,
                k=2,
                score_function="sigmoid",
                normalize_top_k=True,
                routed_scaling_factor=2.5,
                n_group=4,
                topk_group=2,
                selection_bias=True,
                bias_update_rate=1e-3,
            ),
            keras_moe.FeedForwardExperts(8, 8, activation="gated-silu"),
            dispatch="dropless",
            track_metrics=False,
        ),
        lambda rng: [_tokens(rng, 2, 6, D)],
        (2, 6, D),
        4,
        1,
    ),
    # Shared expert beside the routed ones, the global-batch balance loss.
    "keras_moe>MoeLayer:shared_global": Case(
        lambda: keras_moe.MoeLayer(
            routing.TopKRouter(4, k=2),
            keras_moe.FeedForwardExperts(4, 8),
            shared_experts=keras_moe.SharedExpertFeedForward(8, activation="relu"),
            balance_loss="global",
            track_metrics=False,
        ),
        lambda rng: [_tokens(rng, 2, 6, D)],
        (2, 6, D),
        5,
    ),
    # Fine-grained top-k with a gated shared expert, loss-free balancing, sequence loss.
    "keras_moe>TopKFeedForward": Case(
        lambda: keras_moe.TopKFeedForward(
            4,
            4,
            k=2,
            activation="gated-silu",
            shared_d_ff=8,
            shared_expert_gate=True,
            selection_bias=True,
            bias_update_rate=1e-3,
            balance_loss="sequence",
            track_metrics=False,
        ),
        lambda rng: [_tokens(rng, 2, 6, D)],
        (2, 6, D),
        8,
        1,
    ),
    "keras_moe>SharedExpertFeedForward": Case(
        lambda: keras_moe.SharedExpertFeedForward(16, gate=True),
        lambda rng: [_tokens(rng, 2, 5, D)],
        (2, 5, D),
        4,
    ),
    "keras_moe>SwitchFeedForward": Case(
        lambda: keras_moe.SwitchFeedForward(4, 8, activation="gated-gelu", track_metrics=False),
        lambda rng: [_tokens(rng, 2, 6, D)],
        (2, 6, D),
        4,
    ),
    "keras_moe>GShardFeedForward": Case(
        lambda: keras_moe.GShardFeedForward(
            4, 8, group_size=4, router_bias=True, track_metrics=False
        ),
        lambda rng: [_tokens(rng, 2, 6, D)],
        (2, 6, D),
        4,
    ),
    "keras_moe>RelativePositionBias": Case(
        lambda: RelativePositionBias(
            num_heads=3, num_buckets=8, max_distance=16, bidirectional=False
        ),
        lambda rng: [np.arange(5, dtype="int32")[None], np.arange(7, dtype="int32")[None]],
        (1, 3, 5, 7),
        1,
    ),
    "keras_moe>RMSNorm": Case(
        lambda: RMSNorm(1e-6), lambda rng: [_tokens(rng, 2, 5, D)], (2, 5, D), 1
    ),
    "keras_moe>DenseFeedForward": Case(
        lambda: DenseFeedForward(32, "gated-gelu"),
        lambda rng: [_tokens(rng, 2, 5, D)],
        (2, 5, D),
        3,
    ),
    "keras_moe>T5Attention": Case(
        lambda: T5Attention(num_heads=2, d_kv=8),
        lambda rng: [_tokens(rng, 2, 5, D), _tokens(rng, 2, 7, D)],
        (2, 5, D),
        4,
    ),
    "keras_moe>EncoderBlock": Case(
        lambda: EncoderBlock(D, 2, 8, ffn=DenseFeedForward(32, "gated-gelu", name="ffn")),
        lambda rng: [_tokens(rng, 2, 5, D), np.zeros((1, 2, 5, 5), "float32")],
        (2, 5, D),
        9,
    ),
    # A block with a MoE FFN: `from_config` rebuilds that FFN from the block's config.
    "keras_moe>EncoderBlock:switch": Case(
        lambda: EncoderBlock(
            D, 2, 8, ffn=keras_moe.SwitchFeedForward(4, 8, track_metrics=False, name="ffn")
        ),
        lambda rng: [_tokens(rng, 2, 5, D), np.zeros((1, 2, 5, 5), "float32")],
        (2, 5, D),
        9,
    ),
    "keras_moe>DecoderBlock": Case(
        lambda: DecoderBlock(D, 2, 8, ffn=DenseFeedForward(32, "gated-gelu", name="ffn")),
        lambda rng: [
            _tokens(rng, 2, 3, D),
            np.zeros((1, 2, 3, 3), "float32"),
            _tokens(rng, 2, 5, D),
            np.zeros((1, 2, 3, 5), "float32"),
        ],
        (2, 3, D),
        14,
    ),
}


def case_classes():
    """The registered class names the cases cover (a configuration suffix dropped)."""
    return sorted({name.split(":")[0] for name in CASES})


def registered_layers():
    """Names of the registered keras_moe classes that are layers but not models.

    Not the keras-hub adapters (`keras_moe.keras_hub`: `SparseMoeBlock` and its
    per-family subclasses, registered when that optional module is imported):
    they return keras-hub's `(outputs, router_logits)` pair inside keras-hub's
    decoders, and tests/keras_hub checks them there (logits, training, saving,
    both backends)."""
    return sorted(
        name
        for name, obj in keras.saving.get_custom_objects().items()
        if name.startswith("keras_moe>")
        and isinstance(obj, type)
        and issubclass(obj, keras.layers.Layer)
        and not issubclass(obj, keras.Model)
        and not obj.__module__.startswith("keras_moe.keras_hub")
    )


def _numpy(tree):
    return [np.asarray(keras.ops.convert_to_numpy(t)) for t in keras.tree.flatten(tree)]


def _assert_same(a, b, what):
    for x, y in zip(_numpy(a), _numpy(b), strict=True):
        np.testing.assert_allclose(x, y, rtol=1e-6, atol=1e-6, err_msg=what)


def check_layer(name, case, seed=0):
    """Runs every check of `case`; raises AssertionError naming what failed."""
    rng = np.random.default_rng(seed)
    keras.utils.set_random_seed(seed)
    inputs = case.inputs(rng)
    layer = case.build()
    out = layer(*inputs)
    assert tuple(out.shape) == case.output_shape, (name, tuple(out.shape))
    assert len(layer.trainable_weights) == case.trainable_weights, (
        name,
        [w.path for w in layer.trainable_weights],
    )
    assert len(layer.non_trainable_weights) == case.non_trainable_weights, (
        name,
        [w.path for w in layer.non_trainable_weights],
    )

    config = layer.get_config()
    clone = type(layer).from_config(config)
    clone(*inputs)
    assert keras.saving.serialize_keras_object(clone) == keras.saving.serialize_keras_object(
        layer
    ), name
    clone.set_weights(layer.get_weights())
    _assert_same(clone(*inputs), out, f"{name}: from_config")

    symbolic = [
        keras.Input(shape=x.shape[1:], batch_size=x.shape[0], dtype=str(x.dtype)) for x in inputs
    ]
    model = keras.Model(symbolic, layer(*symbolic))
    path = os.path.join(tempfile.mkdtemp(), "layer.keras")
    model.save(path)
    loaded = keras.saving.load_model(path, safe_mode=True)
    _assert_same(loaded(inputs), out, f"{name}: .keras round trip")
    loaded_layer = [sub for sub in loaded.layers if isinstance(sub, type(layer))]
    assert len(loaded_layer) == 1 and type(loaded_layer[0]) is type(layer), name
    _check_mixed_bfloat16(name, case, layer, inputs, out)
    _check_training_step(name, layer, inputs, out, rng)


def _check_mixed_bfloat16(name, case, float32_layer, inputs, float32_out):
    before = keras.config.dtype_policy()
    keras.config.set_dtype_policy("mixed_bfloat16")
    try:
        layer = case.build()
        layer(*inputs)
    finally:
        keras.config.set_dtype_policy(before)
    assert all(w.dtype == "float32" for w in layer.weights), (
        name,
        [(w.path, w.dtype) for w in layer.weights if w.dtype != "float32"],
    )
    routers = [sub for sub in [layer] + compat.sublayers(layer) if isinstance(sub, Router)]
    assert all(r.compute_dtype == "float32" for r in routers), (name, "router not float32")
    layer.set_weights(float32_layer.get_weights())
    out = layer(*inputs)
    # bfloat16 keeps 8 bits of mantissa: a few 1e-2 of the output's scale after
    # a matmul or two.
    for x, y in zip(_numpy(out), _numpy(float32_out), strict=True):
        x = x.astype("float32")
        assert np.all(np.isfinite(x)), name
        scale = max(float(np.max(np.abs(y))), 1e-3)
        assert float(np.max(np.abs(x - y))) <= 0.05 * scale, (
            name,
            "mixed_bfloat16 output far from float32",
            float(np.max(np.abs(x - y))),
            scale,
        )


def _check_training_step(name, layer, inputs, out, rng):
    symbolic = [
        keras.Input(shape=x.shape[1:], batch_size=x.shape[0], dtype=str(x.dtype)) for x in inputs
    ]
    model = keras.Model(symbolic, layer(*symbolic))
    # Eager on TensorFlow (tracing costs more than the step); jitted on JAX.
    model.compile(
        optimizer=keras.optimizers.SGD(0.1),
        loss="mse",
        run_eagerly=keras.backend.backend() == "tensorflow",
    )
    before = [np.array(keras.ops.convert_to_numpy(w)) for w in layer.trainable_weights]
    target = rng.normal(size=tuple(out.shape)).astype("float32")
    loss = model.train_on_batch(inputs, target)  # a block's masks broadcast over the batch
    assert np.isfinite(loss), (name, loss)
    unchanged = [
        w.path
        for w, b in zip(layer.trainable_weights, before, strict=False)
        if np.array_equal(keras.ops.convert_to_numpy(w), b)
    ]
    assert not unchanged, (name, "no gradient reached", unchanged)
