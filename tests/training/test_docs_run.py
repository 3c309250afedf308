"""README quick start 3 (`pretrain_docs.gin`): its missing apt packages."""

import os
import shutil
import subprocess

from tests.training.helpers import REPO

APT = "apt-get update && apt-get install -y python3.11-doc perl-doc"


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
        [executable, "--gin_file=pretrain_docs.gin", f"--model_dir={model_dir}",
         "--gin_bindings=TRAIN_STEPS = 2", "--gin_bindings=BATCH_SIZE = 2"],
        cwd=str(tmp_path), env=env, capture_output=True, text=True, timeout=300)
    console = result.stdout + result.stderr
    assert result.returncode == 2, console[-4000:]
    errors = [line for line in console.splitlines() if "error" in line.lower()]
    assert errors == [line for line in errors if line.startswith("keras-moe-train: error: ")]
    assert len(errors) == 1, console[-4000:]
    assert APT in errors[0] and "'docs_span_corruption'" in errors[0], errors[0]
    assert str(empty) in errors[0]  # where it looked
    assert "Traceback" not in console
    assert "starting from step 0" not in console  # stopped before the model was built
    assert not model_dir.exists() or os.listdir(model_dir) == []
