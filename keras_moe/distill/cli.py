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

import contextlib
import json
import os
import sys

from keras_moe.training.cli import build_parser, set_tf_environment


@contextlib.contextmanager
def distiller_as_model(built):
    """Makes `keras_moe.training.trainer.train` build the distiller; appends it to `built`.

    Until the trainer takes a model factory argument, this wraps its
    `build_compiled_model` for the duration of the block: during that one
    call, `keras_moe.models.build_model` is the gin-configured
    `build_distiller`, so the trainer's own optimizer and compile logic apply
    (`Distiller.compile_defaults` drops the T5 loss: the distiller has its own).
    """
    from keras_moe import models
    from keras_moe.distill import gin_configurables
    from keras_moe.training import trainer

    original = trainer.build_compiled_model

    def factory(*args, **kwargs):
        plain = models.build_model
        models.build_model = gin_configurables.build_distiller
        try:
            model = original(*args, **kwargs)
        finally:
            models.build_model = plain
        built.append(model)
        return model

    trainer.build_compiled_model = factory
    try:
        yield
    finally:
        trainer.build_compiled_model = original


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
    from keras_moe.training.errors import TrainingConfigError

    files = args.gin_file or ["tiny_local.gin"]
    if not any(os.path.basename(f).startswith("distill") for f in files):
        files = files + ["distill.gin"]
    try:
        from keras_moe.training import config
        from keras_moe.training import gin_configurables
        from keras_moe.training import trainer

        import keras_moe.distill.gin_configurables  # noqa: F401

        config.parse_gin(files, args.gin_bindings, args.gin_allow_import)
        trainer.prepare_model_dir(args.model_dir)
        built = []
        with distiller_as_model(built):
            summary = gin_configurables.train(args.model_dir,
                                              write_config=config.write_operative_config)
    except TrainingConfigError as e:
        print(f"keras_moe.distill: error: {e}", file=sys.stderr, flush=True)
        return 2
    student_path = save_student(built[-1], os.path.abspath(args.model_dir))
    print(trainer.format_summary(summary), flush=True)
    print(f"student         {student_path}", flush=True)
    return 0
