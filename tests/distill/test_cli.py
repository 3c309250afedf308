"""The training CLI's distillation mode: teacher checkpoint in; checkpoints, resume, TensorBoard."""

import json
import os
import shutil

import numpy as np
import pytest

import gin
import keras_moe
from tests.shared_runs import built_once
from tests.training.helpers import TINY, run_cli_here
from tests.training.tiny_run import GROUP, tiny_run


@pytest.fixture(scope="session")
def teacher_dir(tmp_path_factory):
    """The shared README quick-start run of the TINY model (the tests only read it)."""
    return str(tiny_run(tmp_path_factory)[0])


def _distill(model_dir, teacher_dir, steps):
    """The distillation CLI in this process: a CompletedProcess (`run_cli_here`)."""
    from keras_moe.distill import distill_cli

    args = ["--gin_file=tiny_local.gin", "--gin_file=distill.gin", f"--model_dir={model_dir}"]
    for b in TINY + [
        f'TEACHER_CHECKPOINT = "{teacher_dir}"',
        f"TRAIN_STEPS = {steps}",
        "CheckpointConfig.every = 2",
        "train.summary_batches = 1",
        "DISTILL_TEMPERATURE = 2.0",
    ]:
        args.append(f"--gin_bindings={b}")
    return run_cli_here(args, distill_cli.main)


@pytest.fixture(scope="session")
def distilled_2(tmp_path_factory, teacher_dir):
    """(model dir, console) of a 2-step distillation from the teacher, run once for all
    pytest workers; a test that trains on from it copies it first."""

    def build(path):
        done = _distill(str(path / "run"), teacher_dir, 2)
        (path / "console").write_text(done.stdout)
        assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]

    path = built_once(tmp_path_factory, "distilled_2_steps", build)
    return str(path / "run"), (path / "console").read_text()


def _load_distiller(model_dir, teacher_dir, student_config):
    """The distiller of `model_dir`'s newest checkpoint, and its teacher's config."""
    from keras_moe.distill import build_distiller, resolve_checkpoint

    teacher_config = student_config.replace(
        encoder_sparse_step=2,
        decoder_sparse_step=2,
        sparse_ffn=keras_moe.SwitchFeedForward(
            num_experts=4, d_ff=student_config.d_ff, activation=student_config.activation
        ),
    )
    distiller = build_distiller(teacher_dir, teacher_config)
    distiller.compile(**distiller.compile_defaults())
    distiller.optimizer.build(distiller.trainable_variables)
    distiller.load_weights(resolve_checkpoint(model_dir))
    return distiller, teacher_config


@pytest.mark.slow
@pytest.mark.xdist_group(GROUP)  # one worker: the shared runs are built in turn
def test_distill_cli_trains_resumes_and_keeps_teacher(tmp_path, teacher_dir, distilled_2):
    import keras

    from keras_moe.models import T5Config, build_model

    model_dir = str(tmp_path / "distill")
    shutil.copytree(distilled_2[0], model_dir)
    assert "student initialised from the teacher" in distilled_2[1]
    assert os.path.isfile(os.path.join(model_dir, "checkpoints", "ckpt-00000002.weights.h5"))
    assert os.path.isdir(os.path.join(model_dir, "logs", "train"))
    summary = json.load(open(os.path.join(model_dir, "summary.json")))
    assert {"hard_loss", "soft_loss", "kl_to_teacher", "neg_log_perplexity"} <= set(
        summary["eval_end"]
    )
    assert (
        "build_distiller.alpha = %DISTILL_ALPHA"
        in open(os.path.join(model_dir, "operative_config.gin")).read()
    )

    resumed = _distill(model_dir, teacher_dir, 4)  # resumes at step 2
    assert resumed.returncode == 0, (resumed.stdout + resumed.stderr)[-3000:]
    summary = json.load(open(os.path.join(model_dir, "summary.json")))
    assert (summary["start_step"], summary["end_step"]) == (2, 4)
    assert summary["resumed_from"].endswith("ckpt-00000002.weights.h5")

    # The student alone is a plain dense model; the teacher inside the
    # distillation checkpoint still equals the teacher checkpoint.
    config = T5Config.from_dict(json.load(open(os.path.join(model_dir, "student_config.json"))))
    assert not config.is_sparse
    student = build_model(config)
    student.load_weights(os.path.join(model_dir, "student.weights.h5"))
    from keras_moe.distill import resolve_checkpoint

    distiller, teacher_config = _load_distiller(model_dir, teacher_dir, config)
    reference = build_model(teacher_config)
    reference.load_weights(resolve_checkpoint(teacher_dir))
    for a, b in zip(reference.weights, distiller.teacher.weights, strict=False):
        np.testing.assert_array_equal(a.numpy(), b.numpy(), err_msg=a.path)
    for a, b in zip(student.weights, distiller.student.weights, strict=False):
        np.testing.assert_array_equal(a.numpy(), b.numpy(), err_msg=a.path)
    keras.backend.clear_session()


@pytest.mark.e2e
def test_missing_teacher_checkpoint_is_a_config_error(tmp_path):
    refused = _distill(str(tmp_path / "d"), str(tmp_path / "nowhere"), 2)
    assert refused.returncode == 2 and "teacher_checkpoint" in refused.stderr, refused.stderr


@pytest.mark.slow
@pytest.mark.xdist_group(GROUP)
def test_the_saved_student_is_the_trained_one_when_init_checkpoint_is_set(
    tmp_path, teacher_dir, distilled_2
):
    """An INIT_CHECKPOINT's weights are read into a second model built by the same
    factory; the student file once came from that second model (the start, not the
    trained student)."""
    import keras

    from keras_moe.models import T5Config, build_model

    first = distilled_2[0]  # the INIT_CHECKPOINT (only read)
    second = str(tmp_path / "second")
    from keras_moe.distill import distill_cli

    gin.clear_config()
    args = ["--gin_file=tiny_local.gin", "--gin_file=distill.gin", f"--model_dir={second}"]
    for b in TINY + [
        f'TEACHER_CHECKPOINT = "{teacher_dir}"',
        "TRAIN_STEPS = 2",
        "CheckpointConfig.every = 2",
        "train.summary_batches = 0",
        f'INIT_CHECKPOINT = "{first}"',
    ]:
        args.append(f"--gin_bindings={b}")
    try:
        assert distill_cli.main(args) == 0
    finally:
        gin.clear_config()

    config = T5Config.from_dict(json.load(open(os.path.join(second, "student_config.json"))))

    def student_weights(path):
        student = build_model(config)
        student.load_weights(path)
        return [w.numpy() for w in student.weights]

    saved = student_weights(os.path.join(second, "student.weights.h5"))
    trained = [w.numpy() for w in _load_distiller(second, teacher_dir, config)[0].student.weights]
    start = student_weights(os.path.join(first, "student.weights.h5"))
    for a, b in zip(saved, trained, strict=False):
        np.testing.assert_array_equal(a, b)
    assert any(not np.array_equal(a, b) for a, b in zip(saved, start, strict=False)), (
        "the saved student equals the INIT_CHECKPOINT's: the trained one was not saved"
    )
    keras.backend.clear_session()


@pytest.mark.parametrize(
    "error,code", [("NonFiniteLossError", 3), ("WorkerFailureError", 4), ("TrainingConfigError", 2)]
)
def test_training_failures_exit_with_the_training_cli_codes(
    tmp_path, capsys, error, code, monkeypatch
):
    """The distillation CLI once mapped only configuration errors (exit 2); a NaN loss
    or a dead worker escaped as a traceback (exit 1)."""
    from keras_moe.distill import distill_cli
    from keras_moe.training import errors, train_configurables

    def failing_train(*args, **kwargs):
        if error == "NonFiniteLossError":
            raise errors.NonFiniteLossError(5, float("nan"))
        raise getattr(errors, error)("stopped on purpose")

    monkeypatch.setattr(train_configurables, "train", failing_train)
    gin.clear_config()
    try:
        assert (
            distill_cli.main(
                [
                    "--gin_file=tiny_local.gin",
                    f"--model_dir={tmp_path / 'd'}",
                    '--gin_bindings=TEACHER_CHECKPOINT = "unused"',
                ]
            )
            == code
        )
    finally:
        gin.clear_config()
    expected = "training loss became nan at step 5" if code == 3 else "stopped on purpose"
    assert f"python -m keras_moe.distill: error: {expected}" in capsys.readouterr().err


def test_the_multi_process_flags_are_used_not_ignored(tmp_path, capsys):
    from keras_moe.distill import distill_cli

    gin.clear_config()
    # --process_count without a coordinator is refused by jax.distributed's set-up,
    # which the distillation CLI once skipped (the flags were parsed and dropped).
    code = distill_cli.main(
        [
            "--gin_file=tiny_local.gin",
            f"--model_dir={tmp_path / 'd'}",
            "--process_count=2",
            "--process_index=0",
        ]
    )
    gin.clear_config()
    assert code == 2
    assert "--coordinator_address" in capsys.readouterr().err
