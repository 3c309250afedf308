"""README quick start 3 (`pretrain_docs.gin`): its missing apt packages, and its short variant."""

import os
import shutil
import subprocess

import pytest

import gin
from tests.training.helpers import REPO

APT = "apt-get update && apt-get install -y python3.11-doc perl-doc"


@pytest.mark.e2e
def test_missing_debian_docs_stop_the_command_in_one_line_before_the_model(tmp_path):
    """The command as a user types it, on a machine without the Debian docs (an
    empty folder stands for `/`): exit 2, one error line naming the apt command,
    nothing written, and no model built (resume logs once the model is built)."""
    executable = shutil.which("keras-moe-train")
    assert executable, "keras-moe-train is not on PATH: install the package (scripts/install.sh)"
    empty = tmp_path / "root"
    empty.mkdir()
    model_dir = tmp_path / "run"
    env = dict(os.environ, PYTHONPATH=REPO, KERAS_MOE_DOCS_PREFIX=str(empty))
    # Two steps of a small batch: a build that ignores the missing docs fails fast.
    result = subprocess.run(
        [
            executable,
            "--gin_file=pretrain_docs.gin",
            f"--model_dir={model_dir}",
            "--gin_bindings=TRAIN_STEPS = 2",
            "--gin_bindings=BATCH_SIZE = 2",
        ],
        cwd=str(tmp_path),
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    console = result.stdout + result.stderr
    assert result.returncode == 2, console[-4000:]
    errors = [line for line in console.splitlines() if "error" in line.lower()]
    assert errors == [line for line in errors if line.startswith("keras-moe-train: error: ")]
    assert len(errors) == 1, console[-4000:]
    assert APT in errors[0] and "'docs_span_corruption'" in errors[0], errors[0]
    assert str(empty) in errors[0]  # where it looked
    assert "Traceback" not in console
    assert result.stderr.strip().splitlines()[-1] == errors[0]  # nothing after it
    assert "starting from step 0" not in console  # stopped before the model was built
    assert not model_dir.exists() or os.listdir(model_dir) == []


@pytest.fixture
def _clean_gin():
    gin.clear_config()
    yield
    gin.clear_config()


def test_the_short_variant_is_the_same_job_with_fewer_steps(_clean_gin):
    from keras_moe.gin_config import parse_gin

    names = (
        "MIXTURE_OR_TASK_NAME",
        "TASK_FEATURE_LENGTHS",
        "BATCH_SIZE",
        "TRAIN_STEPS",
        "CheckpointConfig.every",
        "train.log_every",
        "train.expert_load_every",
        "make_optimizer.learning_rate",
        "make_optimizer.warmup_steps",
        "SwitchFeedForward.num_experts",
        "T5Config.d_model",
        "T5Config.num_encoder_layers",
    )

    def job(files):
        parse_gin(files, [])
        values = {name: gin.query_parameter(name if "." in name else f"%{name}") for name in names}
        gin.clear_config()
        return values

    full, short = job(["pretrain_docs.gin"]), job(["pretrain_docs_short.gin"])
    assert (full["TRAIN_STEPS"], short["TRAIN_STEPS"]) == (20000, 100)
    # A checkpoint, an expert-load plot and a log line every 50 / 50 / 10 steps.
    assert (
        short["CheckpointConfig.every"],
        short["train.expert_load_every"],
        short["train.log_every"],
    ) == (50, 50, 10)
    rest = set(names) - {
        "TRAIN_STEPS",
        "CheckpointConfig.every",
        "train.log_every",
        "train.expert_load_every",
    }
    assert {k: short[k] for k in rest} == {k: full[k] for k in rest}
    assert short["MIXTURE_OR_TASK_NAME"] == "docs_span_corruption" and short["BATCH_SIZE"] == 32
