"""Peak memory of one MoE layer training step as tokens grow, per dispatcher, against a dense FFN.

Each configuration runs in its own subprocess so that its peak RSS is its own;
the increase of peak RSS over the process's baseline after building the
layer is reported, split into weight gradients (E times the dense FFN's for
the experts, whatever the dispatcher) and the rest (activations and
workspace). Targets at 32k tokens: gather <= 2x dense, dropless <= 1.5x dense.

    python benchmarks/memory.py
    python benchmarks/memory.py --tokens 2048 8192 32768 --experts 32
    python benchmarks/memory.py --smoke
"""

import argparse
import json
import os
import resource
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


def _peak_rss_mb():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def measure_one(kind, tokens, num_experts, d_model, d_ff, seq_len, capacity_factor):
    """Runs in a child process: one forward+backward step, returns peak-RSS growth in MB."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import numpy as np
    import tensorflow as tf

    import keras_moe
    from benchmarks.layer_speed import DenseFeedForward

    if kind == "dense":
        layer = DenseFeedForward(d_ff)
    else:
        layer = keras_moe.SwitchFeedForward(
            num_experts,
            d_ff,
            train_capacity_factor=capacity_factor,
            dispatch=kind,
            group_size=seq_len,
            min_expert_capacity=0,
            track_metrics=False,
        )
    x = tf.constant(
        np.random.default_rng(0)
        .normal(size=(tokens // seq_len, seq_len, d_model))
        .astype("float32")
    )
    layer(x[:1])

    @tf.function
    def step():
        with tf.GradientTape() as tape:
            y = layer(x, training=True)
            loss = tf.reduce_mean(tf.square(y))
        return tape.gradient(loss, layer.trainable_weights)

    step.get_concrete_function()  # trace outside the measured window
    baseline = _peak_rss_mb()
    [g.numpy() for g in step()]
    growth = _peak_rss_mb() - baseline
    # Weight gradients scale with the parameter count (E x dense for the
    # experts) whatever the dispatcher; report them apart from activations.
    grad_mb = sum(int(np.prod(w.shape)) * 4 for w in layer.trainable_weights) / 2**20
    return {
        "peak_rss_growth_mb": growth,
        "weight_gradients_mb": grad_mb,
        "activations_mb": growth - grad_mb,
        "baseline_mb": baseline,
    }


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, nargs="+", default=[2048, 8192, 32768])
    parser.add_argument("--experts", type=int, default=32)
    parser.add_argument("--d_model", type=int, default=512)
    parser.add_argument("--d_ff", type=int, default=2048)
    parser.add_argument("--seq_len", type=int, default=512)
    parser.add_argument("--capacity_factor", type=float, default=1.25)
    parser.add_argument(
        "--kinds",
        nargs="+",
        default=["dense", "gather", "einsum", "dropless"],
        choices=["dense", "gather", "einsum", "dropless"],
        help="dense FFN and the Switch layer's dispatchers (dense always runs)",
    )
    parser.add_argument("--output", default="memory")
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        kind, tokens = args.child.split(":")
        print(
            json.dumps(
                measure_one(
                    kind,
                    int(tokens),
                    args.experts,
                    args.d_model,
                    args.d_ff,
                    args.seq_len,
                    args.capacity_factor,
                )
            )
        )
        return
    if args.smoke:
        from benchmarks.common import use_smoke_results

        use_smoke_results()  # results/smoke/, not the committed files
        args.tokens, args.experts, args.d_model, args.d_ff, args.seq_len = [256], 4, 16, 32, 64
    from benchmarks import common

    rows = []
    for tokens in args.tokens:
        for kind in ["dense"] + [k for k in args.kinds if k != "dense"]:
            cmd = [
                sys.executable,
                os.path.abspath(__file__),
                "--child",
                f"{kind}:{tokens}",
                "--experts",
                str(args.experts),
                "--d_model",
                str(args.d_model),
                "--d_ff",
                str(args.d_ff),
                "--seq_len",
                str(args.seq_len),
                "--capacity_factor",
                str(args.capacity_factor),
            ]
            out = subprocess.run(
                cmd,
                capture_output=True,
                text=True,
                cwd=ROOT,
                env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"),
            )
            if out.returncode != 0:
                raise RuntimeError(f"{kind} at {tokens} tokens failed:\n{out.stderr[-3000:]}")
            result = json.loads(out.stdout.strip().splitlines()[-1])
            rows.append({"tokens": tokens, "kind": kind, **result})
            print(
                f"T={tokens:6d} {kind:7s} peak RSS growth {result['peak_rss_growth_mb']:9.1f} MB"
                f" (weight gradients {result['weight_gradients_mb']:7.1f} MB,"
                f" activations {result['activations_mb']:8.1f} MB)",
                flush=True,
            )
        dense = next(r for r in rows if r["tokens"] == tokens and r["kind"] == "dense")
        for r in rows:
            if r["tokens"] == tokens:
                r["ratio_vs_dense"] = r["peak_rss_growth_mb"] / max(
                    dense["peak_rss_growth_mb"], 1e-6
                )
                r["activation_ratio_vs_dense"] = r["activations_mb"] / max(
                    dense["activations_mb"], 1e-6
                )
    path = common.write_result(
        args.output,
        {
            "benchmark": "memory",
            "args": vars(args),
            "environment": common.environment(),
            "rows": rows,
        },
    )
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
