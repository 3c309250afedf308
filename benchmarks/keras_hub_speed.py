"""keras-hub's MoE models against the same models after `keras_moe.sparsify`.

Side by side in one process, interleaved: the MoE block alone (forward), the whole
backbone forward (prefill) and one training step (forward + backward of the
backbone), for a Qwen3-MoE of 64 experts top-8 and a Mixtral of 8 experts top-2
(d_model 128, 2 layers, [8, 256] tokens), on the backend of the process. Peak
memory of a training step is measured in a fresh process per model: on TensorFlow its
peak resident set over the one before it, on JAX XLA's temporary buffers of the compiled step.

    python benchmarks/keras_hub_speed.py                       # TensorFlow
    KERAS_BACKEND=jax python benchmarks/keras_hub_speed.py     # JAX
    python benchmarks/keras_hub_speed.py --smoke               # seconds; checks it runs

Targets (issue: keras-hub's MoE models, actually sparse): block >= 0.6 * E / k
faster (4.8x at 64 top-8), backbone forward >= 3x at 64 top-8 and >= 1.5x at 8 top-2.
"""

import argparse
import json
import os
import subprocess
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import warnings  # noqa: E402

import keras  # noqa: E402
import keras_hub  # noqa: E402
import numpy as np  # noqa: E402

import keras_moe  # noqa: E402
from benchmarks import common  # noqa: E402

warnings.filterwarnings("ignore", message=".*dropless.*")  # JAX/CPU's slow-path warning

CONFIGS = {
    "qwen3_moe_64e_top8": dict(
        family="Qwen3Moe",
        num_experts=64,
        top_k=8,
        expert_dim=64,
        args=dict(
            vocabulary_size=512,
            num_layers=2,
            num_query_heads=4,
            num_key_value_heads=2,
            hidden_dim=128,
            intermediate_dim=256,
            moe_intermediate_dim=64,
            head_dim=32,
            num_experts=64,
            top_k=8,
            norm_top_k_prob=True,
        ),
    ),
    "mixtral_8e_top2": dict(
        family="Mixtral",
        num_experts=8,
        top_k=2,
        expert_dim=448,
        args=dict(
            vocabulary_size=512,
            num_layers=2,
            num_query_heads=4,
            num_key_value_heads=2,
            hidden_dim=128,
            intermediate_dim=448,
            num_experts=8,
            top_k=2,
        ),
    ),
}
BLOCK_ATTRIBUTE = {"Qwen3Moe": "mlp", "Mixtral": "_sparse_moe_block"}


def backbone_pair(config, seed=0):
    """(keras-hub's backbone, the same weights sparsified)."""
    make = getattr(keras_hub.models, f"{config['family']}Backbone")
    keras.utils.set_random_seed(seed)
    dense = make(**config["args"])
    sparse = make(**config["args"])
    sparse.set_weights(dense.get_weights())
    return dense, keras_moe.sparsify(sparse)


def inputs_for(batch, length, vocab, seed=0):
    rng = np.random.default_rng(seed)
    return {
        "token_ids": rng.integers(1, vocab, (batch, length)).astype("int32"),
        "padding_mask": np.ones((batch, length), "int32"),
    }


def forward_fn(layer, inputs):
    """A compiled inference call of `layer` on `inputs` (a tensor or a dict)."""
    if keras.backend.backend() == "jax":
        import jax

        trainable = [v.value for v in layer.trainable_variables]
        other = [v.value for v in layer.non_trainable_variables]
        run = jax.jit(lambda t, o, x: layer.stateless_call(t, o, x)[0])
        return lambda: jax.block_until_ready(run(trainable, other, inputs))
    import tensorflow as tf

    run = tf.function(lambda x: layer(x, training=False))
    return lambda: _first(run(inputs)).numpy()


def train_step_fn(backbone, inputs):
    """A compiled forward + backward of the backbone (mean square of its outputs, plus
    its losses) in training mode."""
    if keras.backend.backend() == "jax":
        import jax

        trainable = [v.value for v in backbone.trainable_variables]
        other = [v.value for v in backbone.non_trainable_variables]

        def loss(t, o, x):
            y, _ = backbone.stateless_call(t, o, x, training=True, return_losses=False)
            return jax.numpy.mean(jax.numpy.square(y.astype("float32")))

        step = jax.jit(jax.grad(loss))
        return lambda: jax.block_until_ready(step(trainable, other, inputs))
    import tensorflow as tf

    @tf.function
    def step(x):
        with tf.GradientTape() as tape:
            y = backbone(x, training=True)
            value = tf.reduce_mean(tf.square(tf.cast(y, tf.float32)))
            if backbone.losses:
                value += tf.add_n(backbone.losses)
        return tape.gradient(value, backbone.trainable_weights)

    return lambda: step(inputs)[-1].numpy()  # the last gradient: a dense one


def _first(value):
    return value[0] if isinstance(value, (tuple, list)) else value


def measure(name, config, batch, length, repeats):
    dense, sparse = backbone_pair(config)
    inputs = inputs_for(batch, length, config["args"]["vocabulary_size"])
    hidden = (
        np.random.default_rng(1)
        .normal(size=(batch, length, config["args"]["hidden_dim"]))
        .astype("float32")
    )
    attribute = BLOCK_ATTRIBUTE[config["family"]]
    dense_block = getattr(dense.transformer_layers[0], attribute)
    sparse_block = getattr(sparse.transformer_layers[0], attribute)
    functions = {
        "block_keras_hub": forward_fn(dense_block, hidden),
        "block_sparse": forward_fn(sparse_block, hidden),
        "forward_keras_hub": forward_fn(dense, inputs),
        "forward_sparse": forward_fn(sparse, inputs),
        "train_keras_hub": train_step_fn(dense, inputs),
        "train_sparse": train_step_fn(sparse, inputs),
    }
    times = common.interleaved_medians(functions, repeats)
    ms = {key: round(value["median"] * 1e3, 2) for key, value in times.items()}
    spread = {key: round(value["spread"] * 1e3, 2) for key, value in times.items()}
    speedup = {
        part: round(ms[f"{part}_keras_hub"] / ms[f"{part}_sparse"], 2)
        for part in ("block", "forward", "train")
    }
    e_over_k = config["num_experts"] / config["top_k"]
    targets = {
        "block": round(0.6 * e_over_k, 2),
        "forward": 3.0 if config["num_experts"] >= 64 else 1.5,
    }
    return {
        "config": name,
        "tokens": [batch, length],
        "ms": ms,
        "spread_ms": spread,
        "speedup": speedup,
        "targets": targets,
        "met": {part: speedup[part] >= target for part, target in targets.items()},
    }


def peak_memory_mb(name, model, batch, length):
    """Memory a training step of `model` ("keras_hub" or "sparse") adds: the peak
    resident set of three steps over the resident set before them, in a fresh process."""
    out = subprocess.run(
        [
            sys.executable,
            os.path.abspath(__file__),
            "--memory-one",
            name,
            model,
            str(batch),
            str(length),
            "3",
        ],
        capture_output=True,
        text=True,
        check=True,
        env=dict(os.environ),
    )
    return json.loads(out.stdout.strip().splitlines()[-1])["step_peak_mb"]


def _status_mb(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    raise RuntimeError(f"no {field} in /proc/self/status")


def _jax_step_temp_mb(backbone, inputs):
    """XLA's temporary buffers of the compiled JAX training step (its activations and
    gradients): the process's resident set hardly moves, as XLA reuses its buffers."""
    import jax

    trainable = [v.value for v in backbone.trainable_variables]
    other = [v.value for v in backbone.non_trainable_variables]

    def loss(t, o, x):
        y, _ = backbone.stateless_call(t, o, x, training=True, return_losses=False)
        return jax.numpy.mean(jax.numpy.square(y.astype("float32")))

    compiled = jax.jit(jax.grad(loss)).lower(trainable, other, inputs).compile()
    return round(compiled.memory_analysis().temp_size_in_bytes / 2**20, 1)


def memory_one(name, model, batch, length, steps):
    dense, sparse = backbone_pair(CONFIGS[name])
    backbone = dense if model == "keras_hub" else sparse
    del dense, sparse
    if keras.backend.backend() == "jax":
        temp = _jax_step_temp_mb(backbone, inputs_for(batch, length, 512))
        print(json.dumps({"step_peak_mb": temp}))
        return
    step = train_step_fn(backbone, inputs_for(batch, length, 512))
    step()  # traced and compiled: what follows is the step's own memory
    before = _status_mb("VmRSS")
    with open("/proc/self/clear_refs", "w") as f:  # Linux: resets the peak (VmHWM)
        f.write("5")
    for _ in range(steps):
        step()
    print(json.dumps({"step_peak_mb": round(_status_mb("VmHWM") - before, 1)}))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--length", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--configs", nargs="+", default=list(CONFIGS), choices=list(CONFIGS))
    parser.add_argument("--no-memory", action="store_true")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, results/smoke/")
    parser.add_argument("--memory-one", nargs=5, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.memory_one:
        name, model, batch, length, steps = args.memory_one
        return memory_one(name, model, int(batch), int(length), int(steps))
    if args.smoke:
        common.use_smoke_results()
        args.batch, args.length, args.repeats, args.no_memory = 2, 16, 1, True
    rows = []
    for name in args.configs:
        row = measure(name, CONFIGS[name], args.batch, args.length, args.repeats)
        if not args.no_memory:
            row["train_peak_mb"] = {
                model: peak_memory_mb(name, model, args.batch, args.length)
                for model in ("keras_hub", "sparse")
            }
        rows.append(row)
        print(json.dumps(row), flush=True)
    backend = keras.backend.backend()
    path = common.write_result(
        f"keras_hub_speed_{backend}",
        {"environment": common.environment(), "repeats": args.repeats, "rows": rows},
    )
    print("wrote", path)


if __name__ == "__main__":
    main()
