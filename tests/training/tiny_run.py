"""The README's first command (a tiny Switch model on the embedded corpus), shortened by
gin bindings, trained once per pytest run and shared by the tests that read a run.

Readers: tests/training/test_tensorboard_output.py (its logs and expert-load history;
it resumes a copy) and tests/distill/test_cli.py (the teacher checkpoint). Their
tests share the `xdist_group` GROUP, so one worker trains it while the other works on.
"""

import os
import shlex
import shutil
import subprocess

from tests.shared_runs import built_once
from tests.training.helpers import REPO, cli_bindings

GROUP = "tiny_run"
# Two epochs of 5 steps: a validation pass at steps 5 and 10 (and the start
# evaluation at 0), training scalars and an expert-load measurement at 5 and 10.
RUN = [
    "TRAIN_STEPS = 10",
    "CheckpointConfig.every = 5",
    "train.log_every = 5",
    "train.expert_load_every = 5",
]


def quick_start_command():
    """README.md's first bash block: the `keras-moe-train` command after the install."""
    from tests.docs.test_readme_snippets import README, code_blocks

    block = code_blocks(README, "bash")[0]
    (line,) = [line for line in block.splitlines() if "keras-moe-train" in line]
    command = shlex.split(line.split("&&")[-1])
    assert command[0] == "keras-moe-train" and "--gin_file=tiny_local.gin" in command, command
    return command


def tiny_run(tmp_path_factory):
    """(model dir, console) of the README's first command with the TINY sizes and RUN."""

    def build(path):
        command = quick_start_command()
        executable = shutil.which(command[0])
        assert executable, f"{command[0]} is not on PATH: install the package (scripts/install.sh)"
        args = [
            a if not a.startswith("--model_dir=") else f"--model_dir={path / 'run'}"
            for a in command[1:]
        ]
        env = dict(os.environ, PYTHONPATH=REPO, TF_CPP_MIN_LOG_LEVEL="3", PYTHONUNBUFFERED="1")
        done = subprocess.run(
            [executable, *args, *cli_bindings(RUN)],
            cwd=str(path),
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        (path / "console").write_text(done.stdout + done.stderr)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]

    path = built_once(tmp_path_factory, "readme_tiny_run", build)
    return path / "run", (path / "console").read_text()
