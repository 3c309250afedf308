"""`keras-moe-compile`: compile a gin job's train step for a TPU slice, on any machine.

The TPU compiler (libtpu) compiles one train step of the job for the slice's
chips, without a TPU, and reports what one chip would hold (parameters,
optimizer state, temporaries, peak), whether it fits the generation's HBM, the
FLOPs per step and the collectives GSPMD inserted (all-to-all for experts).

Example:
  keras-moe-compile --gin_file=pretrain_c4_mesh.gin --topology=v5e:4x4 \\
      --gin_bindings='MeshPlacement.mesh_shape = {"data": 1, "expert": 16, "model": 1}'
  keras-moe-compile --gin_file=pretrain_c4_mesh.gin --topology=v5p:2x2x2 \\
      --dtype_policy=mixed_bfloat16 --batch_size=64
  keras-moe-compile --gin_file=tiny_local.gin --num_cpu_devices=4 \\
      --gin_bindings='train.mesh_shape = {"data": 1, "expert": 4, "model": 1}' --json

Progress goes to stderr: a line as each stage starts (reading the gin job,
loading libtpu, building the abstract model, lowering, compiling) and, while
the compiler runs (seconds for tiny models, 10-25 minutes for Switch-Base-128
on a CPU host of a few cores), the elapsed time every --heartbeat_seconds.
When the step does not fit, the report names its largest buffers and the
settings that shrink it.

Exit status: 0 compiled (and fits, for a topology), 1 does not fit the HBM,
2 invalid settings (unknown topology, libtpu missing, a mesh shape whose product
is not the chip count, bad gin).
"""

import argparse
import json
import os
import sys

import keras

from keras_moe import gin_config, startup
from keras_moe.gin_config import GinConfigError
from keras_moe.tpu_compile import compile_job, compile_only, compile_progress
from keras_moe.training.errors import TrainingConfigError
from keras_moe.training.run.dtype_policy import DTYPE_POLICIES
from keras_moe.training.train_cli import add_gin_flags

# Set in the environment of the re-executed process, so it never loops.
_REEXEC_MARK = "KERAS_MOE_COMPILE_REEXEC"


def build_parser(prog="keras-moe-compile"):
    parser = argparse.ArgumentParser(
        prog=prog, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_gin_flags(parser)
    where = parser.add_mutually_exclusive_group()
    where.add_argument(
        "--topology",
        help="TPU slice to compile for, e.g. v5e:4x4, v4:2x2x2, "
        "v5p:2x2x2, v6e:4x4, or a Cloud TPU type such as "
        "v5litepod-8 or v4-32 (needs libtpu)",
    )
    where.add_argument(
        "--num_cpu_devices",
        type=int,
        help="compile for this many emulated CPU devices instead (default "
        "without --topology: the size of the job's mesh)",
    )
    parser.add_argument("--batch_size", type=int, help="global batch (default: the job's)")
    parser.add_argument(
        "--inputs_length", type=int, help="default: the job's TASK_FEATURE_LENGTHS['inputs']"
    )
    parser.add_argument(
        "--targets_length", type=int, help="default: the job's TASK_FEATURE_LENGTHS['targets']"
    )

    parser.add_argument(
        "--dtype_policy",
        choices=DTYPE_POLICIES,
        help="Keras dtype policy of the model (default: the job's "
        "train.dtype_policy, float32 when unbound); mixed_bfloat16: "
        "float32 weights, bfloat16 compute",
    )
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument(
        "--heartbeat_seconds",
        type=float,
        default=60.0,
        help="while the compiler runs, print the elapsed time this often "
        "(stderr, like the stage lines; default 60)",
    )
    return parser


def _cpu_device_count(args):
    """Without --topology: --num_cpu_devices, else the size of the job's mesh."""
    if args.num_cpu_devices:
        return args.num_cpu_devices

    gin_config.parse_gin(
        args.gin_file,
        args.gin_bindings,
        allowed_imports=args.gin_allow_import,
        check_required=False,
    )
    shape = compile_job._job_mesh(compile_job.job_config())[0]
    count = 1
    for size in (shape or {}).values():
        count *= int(size)
    return count


def _device_flag(count):
    return f"--xla_force_host_platform_device_count={count}"


def _environment_ready(cpu_devices=None):
    """True when keras runs on JAX, jax may only use the CPU (libtpu's compiler aside),
    and XLA:CPU emulates `cpu_devices` devices (when given)."""

    ready = (
        keras.backend.backend() == "jax"
        and os.environ.get("JAX_PLATFORMS") == "cpu"
        and os.environ.get("TPU_SKIP_MDS_QUERY")
        and os.environ.get("TPU_WORKER_HOSTNAMES")
    )
    if cpu_devices and cpu_devices > 1:
        ready = ready and _device_flag(cpu_devices) in os.environ.get("XLA_FLAGS", "").split()
    return bool(ready)


def _fail(message):
    print(f"keras-moe-compile: error: {message}", file=sys.stderr)
    return 2


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    with startup.filtered_stderr():  # TensorFlow's start-up lines (the trainer's import)
        args = build_parser().parse_args(argv)

    # Cheap refusals first, before any compiler is loaded.
    if args.topology is not None:
        try:
            args.topology = compile_only.canonical_topology(args.topology)
            compile_only.parse_topology(args.topology)
        except compile_only.CompileOnlyError as e:
            return _fail(f"--topology: {e}")
        missing = compile_only.libtpu_missing_message()
        if missing:
            return _fail(missing)
    if not args.heartbeat_seconds > 0:
        return _fail(f"--heartbeat_seconds must be > 0, got {args.heartbeat_seconds}.")
    if not args.gin_file:
        return _fail("give the job's gin file(s) with --gin_file.")

    try:
        with startup.filtered_stderr():  # the gin files' task imports (TensorFlow, seqio)
            cpu_devices = None if args.topology else _cpu_device_count(args)
    except GinConfigError as e:
        return _fail(str(e))
    if not _environment_ready(cpu_devices):
        # keras_moe (imported to reach this module) has imported keras with the
        # backend the environment named; the compile needs KERAS_BACKEND=jax and
        # JAX_PLATFORMS=cpu from the start, so run again with them set.
        if os.environ.get(_REEXEC_MARK):
            return _fail(
                "could not start keras on JAX with JAX_PLATFORMS=cpu; set "
                "KERAS_BACKEND=jax JAX_PLATFORMS=cpu and run again."
            )
        env = compile_only.setup_environment(dict(os.environ))
        env["KERAS_BACKEND"] = "jax"
        env[_REEXEC_MARK] = "1"
        if cpu_devices and cpu_devices > 1:
            flags = [
                f
                for f in env.get("XLA_FLAGS", "").split()
                if not f.startswith("--xla_force_host_platform_device_count")
            ]
            env["XLA_FLAGS"] = " ".join(flags + [_device_flag(cpu_devices)])
        sys.stdout.flush()
        sys.stderr.flush()
        os.execve(
            sys.executable, [sys.executable, "-m", "keras_moe.tpu_compile.compile_cli", *argv], env
        )
    compile_only.setup_environment()
    startup.quiet_startup()

    feature_lengths = None
    if args.inputs_length or args.targets_length:
        if not (args.inputs_length and args.targets_length):
            return _fail("give both --inputs_length and --targets_length (or neither).")
        feature_lengths = {"inputs": args.inputs_length, "targets": args.targets_length}
    try:
        report = compile_only.compile_train_step(
            args.gin_file,
            args.gin_bindings,
            topology=args.topology,
            num_cpu_devices=cpu_devices,
            batch_size=args.batch_size,
            feature_lengths=feature_lengths,
            allowed_imports=args.gin_allow_import,
            dtype_policy=args.dtype_policy,
            progress=compile_progress.stderr_progress("keras-moe-compile", args.heartbeat_seconds),
        )
    except (compile_only.CompileOnlyError, GinConfigError, TrainingConfigError) as e:
        return _fail(str(e))
    if args.json:
        print(json.dumps(report, indent=1, sort_keys=True))
    else:
        print(compile_only.format_report(report))
    sys.stdout.flush()
    return 1 if report["fits"] is False else 0


if __name__ == "__main__":
    sys.exit(main())
