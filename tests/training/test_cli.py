"""The training CLI's errors, and the deadline-bounded line reader of the subprocess tests."""

import os
import shlex
import subprocess
import sys
import time

import pytest

from tests.training.helpers import lines_in_background, wait_for_line


@pytest.mark.e2e
def test_line_wait_fails_at_its_deadline_on_a_silent_process():
    proc = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(60)"], stdout=subprocess.PIPE, text=True
    )
    try:
        start = time.monotonic()
        with pytest.raises(pytest.fail.Exception, match="in time"):
            wait_for_line(lines_in_background(proc.stdout), "never", start + 1.0, "sleeper")
        assert time.monotonic() - start < 10
    finally:
        proc.kill()
        proc.wait(timeout=30)


# A killed run's restart and a 2-worker run of this CLI are tested in
# tests/reliability/test_kill_resume.py and tests/reliability/test_multi_worker.py.


@pytest.mark.parametrize(
    "extra,message",
    [
        (["--gin_bindings=BATCH_SIZ = 4"], "macro 'BATCH_SIZ' is not defined"),
        (["--gin_bindings=MIXTURE_OR_TASK_NAME = 'no_such_task'"], "no_such_task"),
        (["--gin_file=missing_run.gin"], "missing_run.gin"),
        # A binding nothing reads: the command line as a user types it.
        (
            shlex.split(
                "--gin_bindings='encoder/SwitchFeedForward.batch_prioritized_routing = True'"
            ),
            "`encoder/SwitchFeedForward.batch_prioritized_routing` was bound but the model's "
            "sparse layer is SwitchFeedForward; nothing read it.",
        ),
    ],
)
def test_cli_errors_name_the_problem_and_write_nothing(tmp_path, capsys, extra, message):
    from keras_moe.training import train_cli

    model_dir = tmp_path / "run"
    files = [] if any(e.startswith("--gin_file") for e in extra) else ["--gin_file=tiny_local.gin"]
    code = train_cli.main(files + extra + [f"--model_dir={model_dir}"])
    assert code == 2
    assert message in capsys.readouterr().err
    assert not model_dir.exists() or os.listdir(model_dir) == []


def test_cli_error_message_for_bad_model_dir(tmp_path, capsys):
    from keras_moe.training import train_cli

    a_file = tmp_path / "not_a_dir"
    a_file.write_text("keep me")
    assert train_cli.main(["--gin_file=tiny_local.gin", f"--model_dir={a_file}"]) == 2
    assert "is not a folder" in capsys.readouterr().err
    assert a_file.read_text() == "keep me"


@pytest.mark.e2e
@pytest.mark.parametrize(
    "interrupt, expected",
    [
        (
            KeyboardInterrupt,
            "demo: interrupted; no checkpoint was written yet. Run the same command to resume.",
        ),
        (
            lambda: _interrupted(7, "/runs/x/checkpoints/ckpt-00000004.weights.h5"),
            "demo: interrupted at step 7; the newest checkpoint is "
            "/runs/x/checkpoints/ckpt-00000004.weights.h5. Run the same command to resume.",
        ),
    ],
)
def test_ctrl_c_prints_the_step_and_the_newest_checkpoint_and_exits_130(
    tmp_path, capsys, interrupt, expected
):
    """Ctrl-C during the job (KeyboardInterrupt, or the run's own TrainingInterrupted with its
    step): one line on stderr, no traceback, exit status 130."""
    from keras_moe.training import train_cli

    def body(args):
        raise interrupt()

    code = train_cli.run_cli(
        "demo", ["--gin_file=tiny_local.gin", f"--model_dir={tmp_path / 'run'}"], body
    )
    err = capsys.readouterr().err
    assert code == 130
    assert expected in err and "Traceback" not in err


def _interrupted(step, checkpoint):
    from keras_moe.training.errors import TrainingInterrupted

    return TrainingInterrupted(step, checkpoint)


@pytest.mark.e2e
def test_ctrl_c_inside_the_gin_configured_job_is_one_line_on_its_own_line(
    tmp_path, capsys, monkeypatch
):
    """In a terminal the progress bar leaves the cursor on its line: the message starts
    on a new one; gin's "In call to configurable" line is not printed after it."""
    import gin
    from keras_moe.training import train_cli

    @gin.configurable
    def interrupted_job():
        raise _interrupted(75, None)

    def body(args):
        print("\r 74/100 ━━━━━━ loss: 6.13", end="", flush=True)  # a live progress bar
        interrupted_job()

    monkeypatch.setattr(sys.stdout, "isatty", lambda: True)
    code = train_cli.run_cli(
        "demo", ["--gin_file=tiny_local.gin", f"--model_dir={tmp_path / 'run'}"], body
    )
    out, err = capsys.readouterr()
    assert code == 130
    assert out.endswith("loss: 6.13\n"), repr(out)
    assert err.splitlines() == [
        "demo: interrupted at step 75; no checkpoint was written yet. "
        "Run the same command to resume."
    ], err
