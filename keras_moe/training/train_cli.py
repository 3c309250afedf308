"""`keras-moe-train`: gin-configured training with `model.fit` (TensorFlow or JAX backend).

Example:
  keras-moe-train --gin_file=tiny_local.gin --model_dir=/tmp/keras_moe_tiny
  keras-moe-train --gin_file=pretrain_c4.gin --model_dir=/mnt/runs/c4  # on a TPU VM
  # every host of a TPU pod slice, with one model dir they all mount:
  KERAS_BACKEND=jax keras-moe-train --gin_file=pretrain_c4_mesh.gin \\
      --coordinator_address=auto --model_dir=/mnt/runs/c4_128
"""

import argparse
import os
import sys

from keras_moe import startup
from keras_moe.gin_config import GinConfigError, parse_gin
from keras_moe.training import trainer
from keras_moe.training.checkpoint import CheckpointManager
from keras_moe.training.errors import (
    NonFiniteLossError,
    TrainingConfigError,
    TrainingInterrupted,
    WorkerFailureError,
)
from keras_moe.training.placement import multihost


def set_tf_environment():
    """Environment for a TF-backend run, set before seqio imports jax.

    JAX (pulled in by seqio) must not claim the TPU or GPU of a TF job, so
    `JAX_PLATFORMS=cpu` (also applied to an already imported jax).
    """
    os.environ.setdefault("KERAS_BACKEND", "tensorflow")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    if os.environ["KERAS_BACKEND"] == "tensorflow":
        os.environ["JAX_PLATFORMS"] = "cpu"
        jax = sys.modules.get("jax")
        if jax is not None:
            try:
                jax.config.update("jax_platforms", "cpu")
            except Exception:  # backends already initialised
                pass


def build_parser(prog="keras-moe-train"):
    parser = argparse.ArgumentParser(
        prog=prog, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_gin_flags(parser)
    parser.add_argument(
        "--model_dir", required=True, help="output folder (resumes if it holds checkpoints)"
    )

    multihost.add_flags(parser)
    return parser


def add_gin_flags(
    parser, gin_file_help="gin file (path or name in gin/runs, gin/models); repeatable"
):
    """--gin_file, --gin_bindings and --gin_allow_import, as every keras_moe CLI takes them."""
    parser.add_argument("--gin_file", action="append", default=[], help=gin_file_help)
    parser.add_argument(
        "--gin_bindings",
        action="append",
        default=[],
        help="gin binding, e.g. 'BATCH_SIZE = 32' or 'CheckpointConfig.every = 100'; repeatable",
    )
    add_gin_allow_import_flag(parser)


def add_gin_allow_import_flag(parser):
    parser.add_argument(
        "--gin_allow_import",
        action="append",
        default=[],
        metavar="MODULE",
        help="let gin files `import` MODULE (and its sub-modules) besides "
        "keras_moe, seqio, t5.data, t5.evaluation; repeatable",
    )


def run_cli(prog, argv, body, default_gin_files=("tiny_local.gin",), gin_files=None):
    """What every training CLI does around its `body`, with one set of exit codes.

    Parses the flags of `build_parser`, filters start-up noise, starts
    `jax.distributed` when asked (before anything touches a device), parses the
    gin files and bindings, checks the model dir, then calls `body(args)` and
    prints the text it returns.

    Args:
        prog: the program name in usage and error lines.
        argv: the arguments (None: `sys.argv[1:]`).
        body: `body(args) -> str`, run once gin is parsed.
        default_gin_files: the gin files when no --gin_file is given.
        gin_files: optional `gin_files(files) -> files`, e.g. to append a file.

    Returns:
        The exit status: 0 done; 2 bad settings (flags, gin, data, model dir);
        3 the loss became NaN or infinite; 4 a worker failed or went silent;
        130 interrupted (Ctrl-C): it prints the step and the newest checkpoint, and
        the same command resumes.

    Example:
    >>> run_cli("demo", ["--model_dir=/tmp/demo", "--process_count=2"], lambda args: "never")
    2
    """
    set_tf_environment()
    args = build_parser(prog=prog).parse_args(argv)

    startup.quiet_startup()

    files = list(args.gin_file or default_gin_files)
    if gin_files is not None:
        files = gin_files(files)
    codes = (
        (TrainingConfigError, 2),
        (GinConfigError, 2),
        (NonFiniteLossError, 3),
        (WorkerFailureError, 4),
    )
    try:
        # Before anything touches a device: afterwards JAX sees every process's devices.
        multihost.initialize(args.coordinator_address, args.process_count, args.process_index)
        parse_gin(files, args.gin_bindings, args.gin_allow_import)
        trainer.prepare_model_dir(args.model_dir)
        text = body(args)
    except tuple(error for error, _ in codes) as e:
        print(f"{prog}: error: {error_message(e)}", file=sys.stderr, flush=True)
        return next(code for error, code in codes if isinstance(e, error))
    except (KeyboardInterrupt, TrainingInterrupted) as e:
        if not isinstance(e, TrainingInterrupted):  # before or after the training loop
            e = TrainingInterrupted(checkpoint=_newest_checkpoint(args.model_dir))
        if sys.stdout.isatty():  # a live progress bar leaves the cursor on its line
            print(flush=True)
        print(f"{prog}: {error_message(e)}", file=sys.stderr, flush=True)
        return 130
    print(text, flush=True)
    return 0


def error_message(error: BaseException) -> str:
    """`error`'s message without the "In call to configurable" lines gin appends.

    Args:
        error: an exception, possibly re-raised by gin from inside a configurable.

    Example:
    >>> import gin
    >>> @gin.configurable
    ... def job(steps=1):
    ...     raise ValueError(f"steps must be 2, got {steps}.")
    >>> try:
    ...     job()
    ... except ValueError as e:
    ...     print(repr(str(e).splitlines()[-1][:35]), "|", error_message(e))
    "  In call to configurable 'job' (<f" | steps must be 2, got 1.
    """
    return str(error).split("\n  In call to configurable ")[0]


def _newest_checkpoint(model_dir):
    """The path of the newest committed checkpoint in `model_dir`, or None."""

    try:
        latest = CheckpointManager(os.path.join(model_dir, "checkpoints")).latest()
    except Exception:  # only for the message
        return None
    return latest["path"] if latest else None


def _train(args):
    from keras_moe.training import train_configurables

    summary = train_configurables.train(
        args.model_dir, write_config=train_configurables.write_operative_config
    )
    return trainer.format_summary(summary)


def main(argv=None):
    return run_cli("keras-moe-train", argv, _train)


if __name__ == "__main__":
    sys.exit(main())
