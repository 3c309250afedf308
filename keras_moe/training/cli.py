"""`keras-moe-train`: gin-configured training with `model.fit` (TensorFlow backend).

Example:
  keras-moe-train --gin_file=tiny_local.gin --model_dir=/tmp/keras_moe_tiny
  keras-moe-train --gin_file=pretrain_c4.gin --gin_bindings='STRATEGY = "tpu"' \\
      --gin_bindings='TPU_NAME = "local"' --model_dir=/mnt/runs/c4
  # every host of a TPU pod slice, with one model dir they all mount:
  KERAS_BACKEND=jax keras-moe-train --gin_file=pretrain_c4_mesh.gin \\
      --coordinator_address=auto --model_dir=/mnt/runs/c4_128
"""

import argparse
import os
import sys


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
            except Exception:  # noqa: BLE001 - backends already initialised
                pass


def build_parser(prog="keras-moe-train"):
    parser = argparse.ArgumentParser(prog=prog, description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_gin_flags(parser)
    parser.add_argument("--model_dir", required=True, help="output folder (resumes if it holds "
                        "checkpoints)")
    from keras_moe.training import multihost

    multihost.add_flags(parser)
    return parser


def add_gin_flags(parser, gin_file_help="gin file (path or name in gin/runs, gin/models); "
                                        "repeatable"):
    """--gin_file, --gin_bindings and --gin_allow_import, as every keras_moe CLI takes them."""
    parser.add_argument("--gin_file", action="append", default=[], help=gin_file_help)
    parser.add_argument("--gin_bindings", action="append", default=[],
                        help="gin binding, e.g. 'BATCH_SIZE = 32' or "
                             "'MESH_SHAPE = {\"data\": 2, \"expert\": 8}'; repeatable")
    add_gin_allow_import_flag(parser)


def add_gin_allow_import_flag(parser):
    parser.add_argument("--gin_allow_import", action="append", default=[], metavar="MODULE",
                        help="let gin files `import` MODULE (and its sub-modules) besides "
                             "keras_moe, seqio, t5.data, t5.evaluation; repeatable")


def main(argv=None):
    set_tf_environment()
    args = build_parser().parse_args(argv)
    from keras_moe.training import console

    console.quiet_startup()
    from keras_moe.gin_config import GinConfigError
    from keras_moe.training.errors import (
        NonFiniteLossError,
        TrainingConfigError,
        WorkerFailureError,
    )

    if not args.gin_file:
        args.gin_file = ["tiny_local.gin"]
    try:
        from keras_moe.training import multihost

        # Before anything touches a device: afterwards JAX sees every process's devices.
        multihost.initialize(args.coordinator_address, args.process_count, args.process_index)
        from keras_moe.gin_config import parse_gin
        from keras_moe.training import gin_configurables
        from keras_moe.training import trainer

        parse_gin(args.gin_file, args.gin_bindings, args.gin_allow_import)
        trainer.prepare_model_dir(args.model_dir)
        summary = gin_configurables.train(
            args.model_dir, write_config=gin_configurables.write_operative_config)
    except (TrainingConfigError, GinConfigError) as e:
        print(f"keras-moe-train: error: {e}", file=sys.stderr, flush=True)
        return 2
    except NonFiniteLossError as e:
        print(f"keras-moe-train: error: {e}", file=sys.stderr, flush=True)
        return 3
    except WorkerFailureError as e:
        print(f"keras-moe-train: error: {e}", file=sys.stderr, flush=True)
        return 4
    print(trainer.format_summary(summary), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
