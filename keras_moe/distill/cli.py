"""Distillation mode of the training CLI: `python -m keras_moe.distill`.

Runs `keras_moe.training`'s gin-configured `train` (same strategy, data,
optimizer, atomic checkpoints with resume, preemption backup, TensorBoard,
summary) with the gin-configured `build_distiller` as the model, then writes
the trained student alone to `<model_dir>/student.weights.h5` (a plain dense
`EncoderDecoder` checkpoint; its config is in `student_config.json`).

Give the teacher's run file first, then `distill.gin`:

  python -m keras_moe.distill --gin_file=tiny_local.gin --gin_file=distill.gin \\
      --gin_bindings='TEACHER_CHECKPOINT = "/tmp/keras_moe_tiny"' \\
      --model_dir=/tmp/keras_moe_distill
"""

import json
import os
import sys

from keras_moe.training.cli import build_parser, set_tf_environment


def save_student(distiller, model_dir):
    """Writes `student.weights.h5` and `student_config.json` to `model_dir`; returns the path."""
    from keras_moe.training.checkpoint import atomic_write_text

    path = os.path.join(model_dir, "student.weights.h5")
    tmp = os.path.join(model_dir, f".tmp-{os.getpid()}-student.weights.h5")
    distiller.student.save_weights(tmp, overwrite=True)
    os.replace(tmp, path)
    atomic_write_text(os.path.join(model_dir, "student_config.json"),
                      json.dumps(distiller.student.config.to_dict(), indent=1))
    return path


def main(argv=None):
    set_tf_environment()
    parser = build_parser(prog="python -m keras_moe.distill")
    args = parser.parse_args(argv)
    from keras_moe.training import console

    console.quiet_startup()
    from keras_moe.gin_config import GinConfigError
    from keras_moe.training.errors import TrainingConfigError

    files = args.gin_file or ["tiny_local.gin"]
    if not any(os.path.basename(f).startswith("distill") for f in files):
        files = files + ["distill.gin"]
    try:
        from keras_moe.gin_config import parse_gin
        from keras_moe.training import gin_configurables
        from keras_moe.training import trainer
        from keras_moe.distill.gin_configurables import build_distiller

        parse_gin(files, args.gin_bindings, args.gin_allow_import)
        trainer.prepare_model_dir(args.model_dir)
        built = []

        def distiller():  # the gin-configured `build_distiller`, kept to save its student
            built.append(build_distiller())
            return built[-1]

        summary = gin_configurables.train(
            args.model_dir, model=distiller,
            write_config=gin_configurables.write_operative_config)
    except (TrainingConfigError, GinConfigError) as e:
        print(f"keras_moe.distill: error: {e}", file=sys.stderr, flush=True)
        return 2
    student_path = save_student(built[-1], os.path.abspath(args.model_dir))
    print(trainer.format_summary(summary), flush=True)
    print(f"student         {student_path}", flush=True)
    return 0
