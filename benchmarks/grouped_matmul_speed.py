"""Forward + backward time of one grouped matmul per kernel, against a dense matmul.

`grouped_matmul(x [N, k], w [E, k, n], group_sizes)` with random group sizes
(each row's group drawn uniformly) and the loss `sum(y * c)`, gradients of x
and w, against `x @ w0` of the same rows (gradients of x and w0), timed side by
side in one process. On JAX every CPU kernel is timed ("tiled", "looped" and
"ragged_dot", the last where `--ragged_dot_max_experts` allows: it is one dense
matmul per group on XLA:CPU); on TensorFlow the one kernel.

    python benchmarks/grouped_matmul_speed.py
    KERAS_BACKEND=jax python benchmarks/grouped_matmul_speed.py
    python benchmarks/grouped_matmul_speed.py --smoke     # seconds; checks it runs
"""

import argparse
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import keras
import numpy as np

from benchmarks import common
from keras_moe.dispatch.grouped_matmul import grouped_matmul


def gradient_fn(product, x, w, c):
    """A compiled function returning the gradients of sum(product(x, w) * c) for x and w."""
    if keras.backend.backend() == "jax":
        import jax

        grad = jax.jit(jax.grad(lambda x, w: jax.numpy.sum(product(x, w) * c), argnums=(0, 1)))
        return lambda: jax.block_until_ready(grad(x, w))
    import tensorflow as tf

    x, w, c = tf.constant(x), tf.Variable(w), tf.constant(c)

    @tf.function
    def step():
        with tf.GradientTape() as tape:
            tape.watch(x)
            loss = tf.reduce_sum(product(x, w) * c)
        return tape.gradient(loss, [x, w])

    return lambda: [g.numpy() for g in step()[:1]]


def run(args):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(args.rows, args.k)).astype("float32")
    c = rng.normal(size=(args.rows, args.n)).astype("float32")
    functions = {
        "dense": gradient_fn(
            lambda x, w: x @ w, x, rng.normal(size=(args.k, args.n)).astype("float32"), c
        )
    }
    jax = keras.backend.backend() == "jax"
    for num_experts in args.experts:
        w = (rng.normal(size=(num_experts, args.k, args.n)) * 0.05).astype("float32")
        sizes = np.bincount(rng.integers(0, num_experts, args.rows), minlength=num_experts).astype(
            "int32"
        )
        kernels = ["tiled", "looped"] if jax else ["auto"]
        if jax and num_experts <= args.ragged_dot_max_experts:
            kernels.append("ragged_dot")
        for kernel in kernels:
            functions[f"{kernel}/E{num_experts}"] = gradient_fn(
                lambda x, w, s=sizes, kernel=kernel: grouped_matmul(x, w, s, kernel=kernel), x, w, c
            )
    timings = common.interleaved_medians(functions, args.repeats)
    dense = timings["dense"]["median"]
    rows = []
    for name, timing in timings.items():
        if name == "dense":
            continue
        kernel, experts = name.split("/")
        rows.append(
            {
                "kernel": kernel,
                "num_experts": int(experts[1:]),
                "t_s": timing["median"],
                "spread_s": timing["spread"],
                "t_dense_s": dense,
                "ratio_vs_dense": timing["median"] / dense,
            }
        )
        print(
            f"{name:16s} {timing['median'] * 1e3:8.1f} ms = {rows[-1]['ratio_vs_dense']:.2f}x "
            f"dense ({dense * 1e3:.1f} ms)",
            flush=True,
        )
    return rows


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=8192)
    parser.add_argument("--k", type=int, default=512)
    parser.add_argument("--n", type=int, default=2048)
    parser.add_argument("--experts", type=int, nargs="+", default=[8, 32, 128])
    parser.add_argument("--ragged_dot_max_experts", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument(
        "--output", default=None, help="result name (default: grouped_matmul_speed_<backend>)"
    )
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, for tests")
    args = parser.parse_args(argv)
    if args.smoke:
        common.use_smoke_results()
        args.rows, args.k, args.n, args.experts, args.repeats = 64, 8, 16, [2, 4], 1
    rows = run(args)
    path = common.write_result(
        args.output or f"grouped_matmul_speed_{keras.backend.backend()}",
        {
            "benchmark": "grouped_matmul_speed",
            "args": vars(args),
            "environment": common.environment(),
            "rows": rows,
        },
    )
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
