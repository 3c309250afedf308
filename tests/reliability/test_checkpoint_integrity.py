"""A checkpoint torn by a crash never replaces the last good one; a corrupt one is skipped."""

import os
import shutil

import keras
import pytest

from keras_moe.training import checkpoint as ckpt_lib
from keras_moe.training.checkpoint import checkpoint_manager
from tests.reliability import helpers
from tests.shared_runs import built_once

# One worker runs these tests one after the other: they copy one shared run.
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("checkpoint_integrity")]

RUN = helpers.FAST + ["CheckpointConfig.every = 4", "CheckpointConfig.keep = 3"]


def _ckpt_dir(model_dir):
    return os.path.join(model_dir, "checkpoints")


@pytest.fixture(scope="session")
def _trained_to_8(tmp_path_factory):
    """One run for all pytest workers; the tests change copies of it."""
    return str(
        built_once(
            tmp_path_factory,
            "integrity_run_at_8",
            lambda path: helpers.train_in_process(path, RUN + ["TRAIN_STEPS = 8"]),
        )
    )


@pytest.fixture
def run_at_8(_trained_to_8, tmp_path):
    """A copy of one run trained for 8 steps, with checkpoints at steps 4 and 8."""
    model_dir = str(tmp_path / "run")
    shutil.copytree(_trained_to_8, model_dir)
    return model_dir


@pytest.mark.parametrize("damage", ["truncate", "flip_bytes"])
def test_corrupt_newest_checkpoint_is_named_and_the_previous_one_used(run_at_8, capsys, damage):
    model_dir = run_at_8
    manager = ckpt_lib.CheckpointManager(_ckpt_dir(model_dir))
    assert [m["step"] for m in manager.all()] == [4, 8]
    bad = manager.weights_path(8)
    data = open(bad, "rb").read()
    with open(bad, "wb") as f:
        if damage == "truncate":
            f.write(data[: len(data) // 2])
        elif damage == "flip_bytes":  # Same size: only the checksum can tell.
            f.write(data[:-4096] + bytes(b ^ 0xFF for b in data[-4096:]))
    capsys.readouterr()
    summary = helpers.train_in_process(model_dir, RUN + ["TRAIN_STEPS = 10"])
    out = capsys.readouterr().out
    assert f"checkpoint {bad} is" in out and "Skipping it" in out, out[-2000:]
    assert ("truncated" in out) if damage != "flip_bytes" else ("sha256" in out)
    assert f"resumed from checkpoint {manager.weights_path(4)} at step 4" in out
    assert summary["start_step"] == 4 and summary["end_step"] == 10
    # Training re-wrote step 8 from the good step-4 state.
    assert [m["step"] for m in manager.all()] == [4, 8, 10]
    ckpt_lib.verify_checkpoint(manager.all()[1])


def test_all_checkpoints_corrupt_is_a_clear_error(run_at_8):
    from keras_moe.training.errors import TrainingConfigError

    manager = ckpt_lib.CheckpointManager(_ckpt_dir(run_at_8))
    for step in (4, 8):
        open(manager.weights_path(step), "wb").close()
    with pytest.raises(TrainingConfigError, match="none of them can be loaded"):
        helpers.train_in_process(run_at_8, RUN + ["TRAIN_STEPS = 12"])


def test_death_in_the_middle_of_a_checkpoint_write_keeps_the_last_good_one(
    tmp_path, monkeypatch, capsys
):
    model_dir = str(tmp_path / "run")
    original = keras.Model.save_weights

    def dies_half_way(self, filepath, *args, **kwargs):
        original(self, filepath, *args, **kwargs)
        if int(self.optimizer.iterations.numpy()) == 8:
            size = os.path.getsize(filepath)
            with open(filepath, "r+b") as f:  # Part of the temp file is on disk ...
                f.truncate(size // 3)
            raise SystemExit("simulated death while writing the checkpoint")  # ... then death.

    monkeypatch.setattr(keras.Model, "save_weights", dies_half_way)
    with pytest.raises(SystemExit, match="simulated death"):
        helpers.train_in_process(model_dir, RUN + ["TRAIN_STEPS = 12"])
    monkeypatch.setattr(keras.Model, "save_weights", original)
    manager = ckpt_lib.CheckpointManager(_ckpt_dir(model_dir))
    assert [m["step"] for m in manager.all()] == [4]
    assert sorted(os.listdir(_ckpt_dir(model_dir))) == [
        "checkpoint",
        "ckpt-00000004.json",
        "ckpt-00000004.weights.h5",
    ]
    capsys.readouterr()
    summary = helpers.train_in_process(model_dir, RUN + ["TRAIN_STEPS = 12"])
    assert "at step 4" in capsys.readouterr().out
    assert summary["start_step"] == 4 and summary["end_step"] == 12


def test_a_crash_before_the_metadata_commit_is_not_a_checkpoint(run_at_8, monkeypatch):
    helpers.parse(RUN)
    manager = ckpt_lib.CheckpointManager(_ckpt_dir(run_at_8))

    def dies(path, text):
        raise SystemExit("died before the json was renamed into place")

    # CheckpointManager commits through its own module's atomic_write_text.
    monkeypatch.setattr(checkpoint_manager, "atomic_write_text", dies)
    from keras_moe.training import train_configurables, trainer

    net = trainer.build_compiled_model(optimizer=train_configurables.make_optimizer)
    ckpt_lib.restore(net, manager.latest())
    with pytest.raises(SystemExit):
        manager.save(net, 12)
    assert manager.latest()["step"] == 8  # A weights file without its json is ignored.
