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

from keras_moe.training import trainer
from keras_moe.training.checkpoint import atomic_write_text
from keras_moe.training.train_cli import run_cli


def save_student(distiller, model_dir):
    """Writes `student.weights.h5` and `student_config.json` to `model_dir`; returns the path."""

    path = os.path.join(model_dir, "student.weights.h5")
    tmp = os.path.join(model_dir, f".tmp-{os.getpid()}-student.weights.h5")
    distiller.student.save_weights(tmp, overwrite=True)
    os.replace(tmp, path)
    atomic_write_text(
        os.path.join(model_dir, "student_config.json"),
        json.dumps(distiller.student.config.to_dict(), indent=1),
    )
    return path


def _with_distill_gin(files):
    if not any(os.path.basename(f).startswith("distill") for f in files):
        files = files + ["distill.gin"]
    return files


def _distill(args):
    from keras_moe.distill.distill_configurables import build_distiller
    from keras_moe.training import train_configurables

    summary = train_configurables.train(
        args.model_dir,
        model=build_distiller,
        write_config=train_configurables.write_operative_config,
    )
    # The model that trained, not another one built from the same factory (an
    # INIT_CHECKPOINT's source is built by it too).
    student_path = save_student(summary.model, os.path.abspath(args.model_dir))
    return f"{trainer.format_summary(summary)}\nstudent         {student_path}"


def main(argv=None):
    # Errors name the command as it was typed: the console script or the module.
    typed = os.path.basename(sys.argv[0]) if sys.argv else ""
    prog = "keras-moe-distill" if typed == "keras-moe-distill" else "python -m keras_moe.distill"
    return run_cli(prog, argv, _distill, gin_files=_with_distill_gin)
