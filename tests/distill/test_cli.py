"""The distillation mode of the training CLI: teacher checkpoint in, checkpoints/resume/TensorBoard out."""

import json
import os

import gin
import numpy as np
import pytest

from tests.training.helpers import TINY, parse


@pytest.fixture(scope="module")
def teacher_dir(tmp_path_factory):
    from keras_moe.training import gin_configurables

    model_dir = str(tmp_path_factory.mktemp("teacher"))
    parse(["TRAIN_STEPS = 2", "CHECKPOINT_EVERY = 2", "SUMMARY_BATCHES = 0"])
    gin_configurables.train(model_dir, tensorboard=False, verbose=0)
    gin.clear_config()
    return model_dir


def _distill(model_dir, teacher_dir, steps):
    from keras_moe.distill import cli

    gin.clear_config()
    args = ["--gin_file=tiny_local.gin", "--gin_file=distill.gin", f"--model_dir={model_dir}"]
    for b in TINY + [f'TEACHER_CHECKPOINT = "{teacher_dir}"', f"TRAIN_STEPS = {steps}",
                     "CHECKPOINT_EVERY = 2", "SUMMARY_BATCHES = 1", "DISTILL_TEMPERATURE = 2.0"]:
        args.append(f"--gin_bindings={b}")
    try:
        return cli.main(args)
    finally:
        gin.clear_config()


@pytest.mark.slow
def test_distill_cli_trains_resumes_and_keeps_teacher(tmp_path, teacher_dir, capsys):
    import keras

    from keras_moe.models import T5Config, build_model

    model_dir = str(tmp_path / "distill")
    assert _distill(model_dir, teacher_dir, 2) == 0
    out = capsys.readouterr().out
    assert "student initialised from the teacher" in out
    assert os.path.isfile(os.path.join(model_dir, "checkpoints", "ckpt-00000002.weights.h5"))
    assert os.path.isdir(os.path.join(model_dir, "logs", "train"))
    summary = json.load(open(os.path.join(model_dir, "summary.json")))
    assert {"hard_loss", "soft_loss", "kl_to_teacher", "neg_log_perplexity"} <= \
        set(summary["eval_end"])
    assert "build_distiller.alpha = %DISTILL_ALPHA" in open(
        os.path.join(model_dir, "operative_config.gin")).read()

    assert _distill(model_dir, teacher_dir, 4) == 0  # resumes at step 2
    summary = json.load(open(os.path.join(model_dir, "summary.json")))
    assert (summary["start_step"], summary["end_step"]) == (2, 4)
    assert summary["resumed_from"].endswith("ckpt-00000002.weights.h5")

    # The student alone is a plain dense model; the teacher inside the
    # distillation checkpoint still equals the teacher checkpoint.
    config = T5Config.from_dict(json.load(open(os.path.join(model_dir, "student_config.json"))))
    assert config.moe_type is None
    student = build_model(config)
    student.load_weights(os.path.join(model_dir, "student.weights.h5"))
    from keras_moe.distill import build_distiller, resolve_checkpoint

    teacher_config = config.replace(moe_type="switch", num_experts=4, encoder_sparse_step=2,
                                    decoder_sparse_step=2, jitter_noise=0.0)
    distiller = build_distiller(teacher_dir, teacher_config)
    distiller.compile(**distiller.compile_defaults())
    distiller.optimizer.build(distiller.trainable_variables)
    distiller.load_weights(resolve_checkpoint(model_dir))
    reference = build_model(teacher_config)
    reference.load_weights(resolve_checkpoint(teacher_dir))
    for a, b in zip(reference.weights, distiller.teacher.weights):
        np.testing.assert_array_equal(a.numpy(), b.numpy(), err_msg=a.path)
    for a, b in zip(student.weights, distiller.student.weights):
        np.testing.assert_array_equal(a.numpy(), b.numpy(), err_msg=a.path)
    keras.backend.clear_session()


def test_missing_teacher_checkpoint_is_a_config_error(tmp_path, capsys):
    assert _distill(str(tmp_path / "d"), str(tmp_path / "nowhere"), 2) == 2
    assert "teacher_checkpoint" in capsys.readouterr().err
