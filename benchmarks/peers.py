"""keras_moe against its peers on the same machine, same sizes, interleaved.

- Switch top-1: `keras_moe.SwitchFeedForward` (gather, einsum and dropless dispatch) vs HF
  transformers' `SwitchTransformersSparseMLP` (torch CPU, weights copied, the
  same per-sequence expert capacity).
- Expert choice: `keras_moe.MoeLayer(ExpertChoiceRouter)` vs TF Model Garden's
  `MoeLayer(ExpertsChooseMaskedRouter)` (run by `tfm_server.py` in its own
  virtual environment, because it needs Keras 2; pass its Python with
  `--tfm_python`, or leave it out to skip that peer).

Reported: median forward+backward seconds and the speed-up of keras_moe over
each peer (target >= 2x). A dense FFN of the same tokens and sizes is timed
beside them in both frameworks (`dense_tf`, `dense_torch`): a top-1 layer does
at least the dense FFN's matmuls, so `speedup_bound_vs_hf` (HF's time over the
faster dense FFN) bounds the speed-up any float32 implementation can reach
over HF on this machine. The dropless layer computes every token (no capacity,
nothing dropped); targets: <= 1.10x the TF dense FFN for E <= 32, <= 1.30x at
E = 128; over HF >= 1.10x at E = 8, >= 1.30x at E = 32, >= 2.5x at E = 128.

    python benchmarks/peers.py --tfm_python /tmp/tfm_venv/bin/python
    python benchmarks/peers.py --precision mixed_bfloat16 --output peers_bf16
    python benchmarks/peers.py --smoke

Set up the Model Garden environment with:
    python -m venv /tmp/tfm_venv && /tmp/tfm_venv/bin/pip install "tensorflow==2.20.*" \
      "tf-keras==2.20.*" "tensorflow-text==2.20.*" tensorflow-hub gin-config pyyaml scipy tf_slim \
      && /tmp/tfm_venv/bin/pip install --no-deps "tf-models-official==2.20.0"
"""

import argparse
import json
import math
import os
import subprocess
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import keras_moe  # noqa: E402
from benchmarks import common  # noqa: E402
from benchmarks.layer_speed import DenseFeedForward, step_fn  # noqa: E402


def torch_precision(precision):
    """A context manager running torch ops in the precision of `--precision`."""
    import contextlib

    import torch

    if precision == "mixed_bfloat16":
        return torch.autocast("cpu", dtype=torch.bfloat16)
    return contextlib.nullcontext()


def hf_switch_step(num_experts, d_model, d_ff, capacity, x_np, threads, precision="float32"):
    import torch
    from transformers import SwitchTransformersConfig
    from transformers.models.switch_transformers import modeling_switch_transformers as hf

    torch.set_num_threads(threads)
    config = SwitchTransformersConfig(
        d_model=d_model,
        d_ff=d_ff,
        num_experts=num_experts,
        expert_capacity=capacity,
        router_jitter_noise=0.0,
        dropout_rate=0.0,
        dense_act_fn="relu",
    )
    mlp = hf.SwitchTransformersSparseMLP(config).train()
    x = torch.from_numpy(x_np)

    def step():
        mlp.zero_grad(set_to_none=True)
        with torch_precision(precision):
            y = mlp(x)
        (y.float() ** 2).mean().backward()
        return mlp.router.classifier.weight.grad

    return mlp, step


def torch_dense_step(d_model, d_ff, x_np, threads, precision="float32"):
    """The dense FFN of the same tokens in torch: the compute floor of the HF layer."""
    import torch

    torch.set_num_threads(threads)
    torch.manual_seed(0)
    ffn = torch.nn.Sequential(
        torch.nn.Linear(d_model, d_ff, bias=False),
        torch.nn.ReLU(),
        torch.nn.Linear(d_ff, d_model, bias=False),
    )
    x = torch.from_numpy(x_np.reshape(-1, d_model))  # 2-D: torch's fastest Linear backward

    def step():
        ffn.zero_grad(set_to_none=True)
        with torch_precision(precision):
            y = ffn(x)
        (y.float() ** 2).mean().backward()
        return ffn[0].weight.grad

    return step


class TfmPeer:
    """Drives tfm_server.py in another Python."""

    def __init__(self, python, config):
        self.proc = subprocess.Popen(
            [python, os.path.join(ROOT, "benchmarks", "tfm_server.py")],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"),
        )
        self.proc.stdin.write(json.dumps(config) + "\n")
        self.proc.stdin.flush()
        self.info = json.loads(self.proc.stdout.readline())

    def step(self):
        self.proc.stdin.write("step\n")
        self.proc.stdin.flush()
        return json.loads(self.proc.stdout.readline())["seconds"]

    def close(self):
        self.proc.stdin.close()
        self.proc.wait(timeout=60)


def run(args):
    rows = []
    for num_experts in args.experts:
        rng = np.random.default_rng(0)
        x_np = rng.normal(size=(args.tokens // args.seq_len, args.seq_len, args.d_model)).astype(
            "float32"
        )
        x = tf.constant(x_np)
        capacity = math.ceil(args.capacity_factor * args.seq_len / num_experts)
        # Dense FFNs of the same tokens and sizes: what one top-1 layer that
        # computes each token once cannot beat (same FLOPs, same GEMM library).
        dtype = args.precision
        timers = {
            "dense_tf": step_fn(DenseFeedForward(args.d_ff, dtype=dtype), x),
            "dense_torch": torch_dense_step(
                args.d_model, args.d_ff, x_np, args.threads, args.precision
            ),
        }
        ours = {}
        for dispatch in ("gather", "einsum", "dropless"):
            # Each sequence is a routing group with HF's capacity (HF routes per sequence).
            layer = keras_moe.SwitchFeedForward(
                num_experts,
                args.d_ff,
                dispatch=dispatch,
                train_capacity_factor=1e-6,
                min_expert_capacity=capacity,
                group_size=args.seq_len,
                track_metrics=False,
                dtype=dtype,
            )
            ours[dispatch] = layer
            timers[f"keras_moe_switch_{dispatch}"] = step_fn(layer, x)
        mlp, hf_step = hf_switch_step(
            num_experts, args.d_model, args.d_ff, capacity, x_np, args.threads, args.precision
        )
        timers["hf_switch_torch"] = hf_step
        ec = keras_moe.MoeLayer(
            keras_moe.ExpertChoiceRouter(num_experts),
            keras_moe.FeedForwardExperts(num_experts, args.d_ff, dtype=dtype),
            dispatch="gather",
            train_capacity_factor=args.capacity_factor,
            min_expert_capacity=0,
            group_size=args.seq_len,
            track_metrics=False,
            dtype=dtype,
        )
        timers["keras_moe_expert_choice_gather"] = step_fn(ec, x)
        peer = None
        if args.tfm_python and args.precision == "float32":
            peer = TfmPeer(
                args.tfm_python,
                {
                    "tokens": args.tokens,
                    "seq_len": args.seq_len,
                    "d_model": args.d_model,
                    "d_ff": args.d_ff,
                    "num_experts": num_experts,
                    "capacity_factor": args.capacity_factor,
                },
            )
            timers["tfm_expert_choice"] = None  # timed by the server
        samples = {name: [] for name in timers}
        for fn in timers.values():
            if fn is not None:
                fn()
        for _ in range(args.repeats):
            for name, fn in timers.items():
                if fn is None:
                    samples[name].append(peer.step())
                    continue
                start = time.perf_counter()
                fn()
                samples[name].append(time.perf_counter() - start)
        if peer is not None:
            peer.close()
        med = {name: float(np.median(v)) for name, v in samples.items()}
        row = {
            "num_experts": num_experts,
            "tokens": args.tokens,
            "capacity": capacity,
            "median_s": med,
            "spread_s": {n: (max(v) - min(v)) / 2 for n, v in samples.items()},
            "speedup_switch_vs_hf": med["hf_switch_torch"] / med["keras_moe_switch_gather"],
            "speedup_bound_vs_hf": med["hf_switch_torch"]
            / min(med["dense_tf"], med["dense_torch"]),
            "keras_moe_over_tf_dense": med["keras_moe_switch_gather"] / med["dense_tf"],
            "speedup_dropless_vs_hf": med["hf_switch_torch"] / med["keras_moe_switch_dropless"],
            "dropless_over_tf_dense": med["keras_moe_switch_dropless"] / med["dense_tf"],
        }
        if peer is not None:
            row["speedup_expert_choice_vs_tfm"] = (
                med["tfm_expert_choice"] / med["keras_moe_expert_choice_gather"]
            )
            row["tfm_tensorflow"] = peer.info["tensorflow"]
        rows.append(row)
        print(f"E={num_experts:4d} " + "  ".join(f"{n}={t * 1e3:.0f}ms" for n, t in med.items()))
        print(
            f"       HF / fastest dense FFN (speed-up bound): {row['speedup_bound_vs_hf']:.2f}"
            f"   keras_moe / TF dense FFN: {row['keras_moe_over_tf_dense']:.2f}"
        )
        print(
            f"       dropless vs HF: {row['speedup_dropless_vs_hf']:.2f}x   dropless / TF dense "
            f"FFN: {row['dropless_over_tf_dense']:.2f}"
        )
        print(
            f"       keras_moe vs HF (switch): {row['speedup_switch_vs_hf']:.2f}x"
            + (
                f"   vs TF Model Garden (expert choice): {row['speedup_expert_choice_vs_tfm']:.2f}x"
                if peer
                else ""
            ),
            flush=True,
        )
    return rows


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=8192)
    parser.add_argument("--seq_len", type=int, default=512)
    parser.add_argument("--experts", type=int, nargs="+", default=[8, 32, 128])
    parser.add_argument("--d_model", type=int, default=512)
    parser.add_argument("--d_ff", type=int, default=2048)
    parser.add_argument("--capacity_factor", type=float, default=1.25)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument(
        "--tfm_python", default=None, help="python of a virtual environment with tf-models-official"
    )
    parser.add_argument(
        "--precision",
        default="float32",
        choices=["float32", "mixed_bfloat16"],
        help="mixed_bfloat16: keras_moe layers with the mixed_bfloat16 policy "
        "(router in float32), torch under CPU bfloat16 autocast; the TF "
        "Model Garden peer runs in float32 only and is skipped",
    )
    parser.add_argument("--output", default="peers")
    parser.add_argument("--smoke", action="store_true")
    args = parser.parse_args(argv)
    if args.smoke:
        from benchmarks.common import use_smoke_results

        use_smoke_results()  # results/smoke/, not the committed files
        args.tokens, args.seq_len, args.experts, args.d_model, args.d_ff = 256, 64, [4], 16, 32
        args.repeats = 2
    rows = run(args)
    path = common.write_result(
        args.output,
        {
            "benchmark": "peers",
            "args": vars(args),
            "environment": common.environment(),
            "rows": rows,
        },
    )
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
