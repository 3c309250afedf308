"""Per-device memory of the gin job's train step on a JAX mesh, from shapes alone.

For each model and device count (or TPU topology), a child process compiles
one `model.train_step` of the gin job with
`keras_moe.tpu_compile.compile_only.compile_train_step`: the model and its
optimizer are built as shapes and layouts only (`keras.StatelessScope`,
`jax.eval_shape`), the step is lowered over abstract arguments carrying the
mesh shardings and compiled, either for that many emulated CPU devices
(XLA:CPU) or, with --topology, for a TPU slice by the TPU compiler itself
(libtpu; no TPU needed). The per-device sizes come from the shard shapes
(parameters, optimizer state) and XLA's buffer assignment (`memory_analysis`:
temporaries, peak); the compiled program's collectives are counted. Nothing of
the model's size is allocated.

    python benchmarks/memory_plan.py                       # both models, 8 / 32 / 64 CPU devices
    python benchmarks/memory_plan.py --models switch_base_128 --devices 8 --output plan_base8
    python benchmarks/memory_plan.py --models switch_base_128 \
        --topology v4:2x2x2 v5e:4x4 v5p:2x2x2 --output memory_plan_tpu   # TPU compiler
    python benchmarks/memory_plan.py --smoke
"""

import argparse
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from benchmarks.memory_plan_compile import plan_one  # noqa: E402
from benchmarks.memory_plan_tables import (  # noqa: E402
    CHIPS,
    compare_table,
    fits,
    markdown_table,
    roofline_markdown_table,
    row_setting,
    tpu_markdown_table,
)

# The gin job's expert-parallel run; each model's gin file is bound after it.
RUN_FILE = "runs/pretrain_c4_mesh.gin"


def _child(args):
    row = plan_one(
        args.gin_file,
        args.devices[0] if args.devices else None,
        args.batch_size,
        args.inputs_length,
        args.targets_length,
        args.bindings or (),
        topology=args.topology[0] if args.topology else None,
        dtype_policy=args.dtype_policy,
    )
    print("PLAN " + json.dumps(row), flush=True)


def _parser():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["switch_base_128", "switch_large_128"])
    parser.add_argument(
        "--devices",
        nargs="+",
        type=int,
        default=None,
        help="emulated CPU device counts (default 8 32 64)",
    )
    parser.add_argument(
        "--topology",
        nargs="+",
        default=None,
        help="TPU slices to compile for with the TPU compiler instead of CPU "
        "devices, e.g. v4:2x2x2 v5e:4x4 v5p:2x2x2 (needs libtpu: "
        'pip install "keras-moe[tpu]")',
    )
    # Default: the job's batch (pretrain_c4.gin: 256 packed sequences of 512 + 114 tokens).
    parser.add_argument("--batch_size", type=int, default=None)
    parser.add_argument("--inputs_length", type=int, default=None)
    parser.add_argument("--targets_length", type=int, default=None)
    parser.add_argument(
        "--dtype_policy",
        default=None,
        help="float32, mixed_bfloat16 or bfloat16 (default: the job's train.dtype_policy, float32)",
    )
    parser.add_argument(
        "--run_file", default=RUN_FILE, help='gin run file before each model file ("" for none)'
    )
    parser.add_argument("--bindings", action="append", help="gin bindings after the files")
    parser.add_argument(
        "--timeout",
        type=int,
        default=3600,
        help="seconds per compile; one that runs longer is recorded as not finished",
    )
    parser.add_argument(
        "--smoke", action="store_true", help="the tiny Switch model on 2 and 4 devices (seconds)"
    )
    parser.add_argument(
        "--output",
        default=None,
        help="results/<output>.json (default memory_plan, memory_plan_tpu with --topology)",
    )
    parser.add_argument(
        "--append",
        action="store_true",
        help="keep the output file's rows of other settings (model, chips, "
        "topology, batch, dtype policy) and replace those of the same",
    )
    parser.add_argument(
        "--compare",
        nargs=2,
        metavar=("TPU_RESULT", "PLAN_RESULT"),
        help="print each TPU row's peak against the plan row (same model, "
        "chip count, batch and dtype policy) of two results/<name>.json "
        "files, then exit",
    )
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--gin_file", action="append", help=argparse.SUPPRESS)
    return parser


def _run_child(args, name, kind, target):
    """One compile in a child process: its row, or a row saying it did not finish."""
    env = dict(
        os.environ,
        KERAS_BACKEND="jax",
        JAX_PLATFORMS="cpu",
        TF_CPP_MIN_LOG_LEVEL="3",
        TPU_SKIP_MDS_QUERY="1",
        TPU_WORKER_HOSTNAMES="localhost",
        # Compile-only: another process (a test, a second benchmark) may hold libtpu.
        ALLOW_MULTIPLE_LIBTPU_LOAD="1",
    )
    if kind == "devices":  # before jax starts its CPU backend in the child
        env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={target}"
    gin_files = [f for f in (args.run_file, f"models/{name}.gin") if f]
    command = [
        sys.executable,
        os.path.abspath(__file__),
        "--child",
        f"--{kind}={target}",
        *[f"--gin_file={f}" for f in gin_files],
        *[
            f"--{k}={getattr(args, k)}"
            for k in ("batch_size", "inputs_length", "targets_length", "dtype_policy")
            if getattr(args, k) is not None
        ],
        *[f"--bindings={b}" for b in args.bindings or ()],
    ]
    where = f"{target} devices" if kind == "devices" else f"TPU {target}"
    try:
        done = subprocess.run(
            command, env=env, capture_output=True, text=True, timeout=args.timeout, cwd=ROOT
        )
    except subprocess.TimeoutExpired:
        print(f"{name:18s} {where}: the compile did not finish in {args.timeout} s", flush=True)
        return {
            "model": name,
            "topology": target if kind == "topology" else None,
            "devices": target if kind == "devices" else None,
            "batch": [args.batch_size],
            "dtype_policy": args.dtype_policy,
            "unfinished_after_seconds": args.timeout,
            "command": " ".join(sys.argv),
        }
    lines = [line for line in done.stdout.splitlines() if line.startswith("PLAN ")]
    if done.returncode or not lines:  # recorded, so the other rows are still written
        print(f"{name:18s} {where}: FAILED\n{done.stderr[-3000:]}", flush=True)
        return {
            "model": name,
            "topology": target if kind == "topology" else None,
            "devices": target if kind == "devices" else None,
            "batch": [args.batch_size],
            "dtype_policy": args.dtype_policy,
            "failed": done.stderr[-2000:],
            "command": " ".join(sys.argv),
        }
    row = json.loads(lines[-1][len("PLAN ") :])
    row["model"], row["command"] = (
        name,
        " ".join(["python benchmarks/memory_plan.py", *sys.argv[1:]]),
    )
    if kind == "devices":
        row["fits"] = fits(row)
    _print_row(row, where)
    return row


def _print_row(row, where):
    gib = 2**30
    head = (
        f"{row['model']:18s} {where} {row['mesh']} {row['dtype_policy']} batch "
        f"{row['batch'][0]}: params {row['param_bytes'] / gib:.2f} GiB, optimizer "
        f"{row['optimizer_bytes'] / gib:.2f}"
    )
    if row["error"]:
        print(
            f"{head}; does NOT fit: {row['error']}; compiled in {row['compile_seconds']} s",
            flush=True,
        )
        return
    print(
        f"{head}, temporaries {row['temp_bytes'] / gib:.2f}, peak "
        f"{row['peak_bytes'] / gib:.2f} GiB/device"
        + (f" of {row['hbm_bytes'] / gib:.0f}" if row["hbm_bytes"] else "")
        + f"; {row['all_to_all']} all-to-all; compiled in {row['compile_seconds']} s",
        flush=True,
    )


def _merge(output, rows):
    """The rows of results/<output>.json whose setting is not among `rows`, then `rows`."""
    from benchmarks import common

    old = (common.read_result(output) or {}).get("rows", [])
    new = {row_setting(r) for r in rows}
    return [r for r in old if row_setting(r) not in new] + rows


def main(argv=None):
    parser = _parser()
    args = parser.parse_args(argv)
    if args.child:
        return _child(args)
    from benchmarks import common

    if args.compare:
        tpu, plan = (common.read_result(name) or {"rows": []} for name in args.compare)
        print(compare_table(tpu["rows"], plan["rows"]))
        return None
    if args.topology and args.devices:
        parser.error("give --devices (CPU devices) or --topology (TPU slices), not both")
    if args.smoke:
        from benchmarks.common import use_smoke_results

        use_smoke_results()  # results/smoke/, not the committed files
        args.run_file, args.models = "runs/tiny_local.gin", ["switch_tiny"]
        if not args.topology:
            args.devices = [2, 4]
        args.batch_size, args.inputs_length, args.targets_length = 8, 32, 8
        args.bindings = ['SwitchFeedForward.group_size = "sequence"']
    if args.output is None:
        args.output = "memory_plan_tpu" if args.topology else "memory_plan"
    targets = (
        [("topology", t) for t in args.topology]
        if args.topology
        else [("devices", d) for d in args.devices or [8, 32, 64]]
    )
    if args.topology:
        from keras_moe.tpu_compile import compile_only

        for name in args.topology:
            compile_only.parse_topology(name)  # unknown names fail before any compile
        missing = compile_only.libtpu_missing_message()
        if missing:
            parser.error(missing)
    rows = [
        _run_child(args, name, kind, target) for name in args.models for kind, target in targets
    ]
    if args.append:
        rows = _merge(args.output, rows)
    payload = {"rows": rows, "environment": common.environment()}
    if not args.topology:
        payload["chips_gib"] = CHIPS
    common.write_result(args.output, payload)
    done = [r for r in rows if "unfinished_after_seconds" not in r and "failed" not in r]
    print(tpu_markdown_table(done) if args.topology else markdown_table(done))
    if args.topology:
        print(roofline_markdown_table(done))


if __name__ == "__main__":
    main()
