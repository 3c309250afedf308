"""Forward+backward time of the MoE layers against a dense FFN of the same d_model/d_ff.

Reports, for each E and T, `t_moe / (capacity_factor * t_dense)` (target <= 1.10
for the Switch layer with the gather dispatcher), `t_moe / t_dense_same_tokens`
(k top-k choices: k dense FFNs' work; dropless target <= 1.10 for E <= 32 and
<= 1.30 at E = 128) and `t(E) / t(E=8)` (target <= 1.2 at E=128), measured side
by side in one process. The dropless dispatcher has no capacity factor.

    python benchmarks/layer_speed.py                      # full sweep
    python benchmarks/layer_speed.py --tokens 8192 --experts 8 16 32 64 128
    python benchmarks/layer_speed.py --smoke              # seconds; checks it runs
"""

import argparse
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import keras
import numpy as np
import tensorflow as tf

import keras_moe
from benchmarks import common


class DenseFeedForward(keras.layers.Layer):
    """The dense baseline: wo · relu(wi · x), no biases (T5 style)."""

    def __init__(self, d_ff, **kwargs):
        super().__init__(**kwargs)
        self.d_ff = d_ff

    def build(self, input_shape):
        d_model = input_shape[-1]
        self.wi = self.add_weight(shape=(d_model, self.d_ff), initializer="glorot_uniform")
        self.wo = self.add_weight(shape=(self.d_ff, d_model), initializer="glorot_uniform")

    def call(self, x, training=None):
        return keras.ops.matmul(keras.ops.relu(keras.ops.matmul(x, self.wi)), self.wo)


def step_fn(layer, x):
    """A compiled forward+backward step (plain tf.function: the fast CPU path)."""
    layer(x[:1])  # build

    @tf.function
    def step():
        with tf.GradientTape() as tape:
            y = layer(x, training=True)
            loss = tf.reduce_mean(tf.square(tf.cast(y, tf.float32)))
            if layer.losses:
                loss += tf.add_n(layer.losses)
        grads = tape.gradient(loss, layer.trainable_weights)
        return loss, grads

    return lambda: [g.numpy() for g in step()[1][:1]]


def run(
    tokens_list, experts_list, d_model, d_ff, capacity_factor, layers, dispatches, repeats, seq_len
):
    rows = []
    for tokens in tokens_list:
        rng = np.random.default_rng(0)
        x = tf.constant(rng.normal(size=(tokens // seq_len, seq_len, d_model)).astype("float32"))
        functions = {"dense": step_fn(DenseFeedForward(d_ff), x)}
        for num_experts in experts_list:
            for layer_name in layers:
                for dispatch in dispatches:
                    if layer_name == "switch":
                        layer = keras_moe.SwitchFeedForward(
                            num_experts,
                            d_ff,
                            train_capacity_factor=capacity_factor,
                            dispatch=dispatch,
                            group_size=seq_len,
                            min_expert_capacity=0,
                        )
                    else:
                        layer = keras_moe.GShardFeedForward(
                            num_experts,
                            d_ff,
                            train_capacity_factor=capacity_factor,
                            dispatch=dispatch,
                            group_size=seq_len,
                            min_expert_capacity=0,
                        )
                    functions[f"{layer_name}/{dispatch}/E{num_experts}"] = step_fn(layer, x)
        timings = common.interleaved_medians(functions, repeats)
        dense = timings["dense"]["median"]
        for name, timing in timings.items():
            if name == "dense":
                continue
            layer_name, dispatch, e = name.split("/")
            k = 1 if layer_name == "switch" else 2
            base = timings.get(f"{layer_name}/{dispatch}/E{experts_list[0]}")
            cf = 1.0 if dispatch == "dropless" else capacity_factor
            rows.append(
                {
                    "tokens": tokens,
                    "layer": layer_name,
                    "dispatch": dispatch,
                    "num_experts": int(e[1:]),
                    "t_moe_s": timing["median"],
                    "t_moe_spread_s": timing["spread"],
                    "t_dense_s": dense,
                    "ratio_vs_cf_dense": timing["median"] / (cf * k * dense),
                    "ratio_vs_dense_same_tokens": timing["median"] / (k * dense),
                    "ratio_vs_first_E": timing["median"] / base["median"],
                }
            )
            print(
                f"T={tokens:6d} {name:22s} {timing['median'] * 1e3:8.1f} ms "
                f"(dense {dense * 1e3:7.1f} ms)  "
                f"t/(k*cf*dense)={rows[-1]['ratio_vs_cf_dense']:.3f}"
                f"  t/t(E={experts_list[0]})={rows[-1]['ratio_vs_first_E']:.3f}",
                flush=True,
            )
    return rows


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, nargs="+", default=[2048, 8192, 32768])
    parser.add_argument("--experts", type=int, nargs="+", default=[8, 16, 32, 64, 128])
    parser.add_argument(
        "--layers", nargs="+", default=["switch", "gshard"], choices=["switch", "gshard"]
    )
    parser.add_argument(
        "--dispatch",
        nargs="+",
        default=["gather", "einsum", "dropless"],
        choices=["gather", "einsum", "dropless"],
    )
    parser.add_argument("--d_model", type=int, default=512)
    parser.add_argument("--d_ff", type=int, default=2048)
    parser.add_argument(
        "--seq_len",
        type=int,
        default=512,
        help="tokens per sequence; each sequence is one routing group",
    )
    parser.add_argument("--capacity_factor", type=float, default=1.25)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--output", default="layer_speed")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, for tests")
    args = parser.parse_args(argv)
    if args.smoke:
        from benchmarks.common import use_smoke_results

        use_smoke_results()  # results/smoke/, not the committed files
        args.tokens, args.experts, args.d_model, args.d_ff = [256], [2, 4], 16, 32
        args.seq_len, args.repeats = 64, 2
    rows = run(
        args.tokens,
        args.experts,
        args.d_model,
        args.d_ff,
        args.capacity_factor,
        args.layers,
        args.dispatch,
        args.repeats,
        args.seq_len,
    )
    path = common.write_result(
        args.output,
        {
            "benchmark": "layer_speed",
            "args": vars(args),
            "environment": common.environment(),
            "rows": rows,
        },
    )
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
