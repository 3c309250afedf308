"""Checkpoints carry the SeedGenerator states: a resumed run draws the dropout masks and
router jitter an uninterrupted run draws, so its losses are the same step for step."""

import json
import os
import shutil
import subprocess
import sys

import keras
import numpy as np
import pytest

from keras_moe.training import checkpoint as ckpt_lib
from keras_moe.training.errors import TrainingConfigError
from tests.reliability import helpers

STEPS = 4
EVERY = 2
RANDOM = [
    "T5Config.dropout_rate = 0.1",
    "SwitchFeedForward.jitter_noise = 0.01",
    "SwitchFeedForward.expert_dropout_rate = 0.1",
]
RUN = helpers.FAST + RANDOM + [f"CheckpointConfig.every = {EVERY}", f"TRAIN_STEPS = {STEPS}"]
X = np.ones((2, 8), "float32")


def _model(rate=0.5):
    model = keras.Sequential(
        [
            keras.Input((8,)),
            keras.layers.Dropout(rate),
            keras.layers.Dense(8),
            keras.layers.Dropout(0.5),
        ]
    )
    model.compile("sgd", "mse")
    model.optimizer.build(model.trainable_variables)
    return model


def _draws(model, n=3):
    return [keras.ops.convert_to_numpy(model(X, training=True)) for _ in range(n)]


@pytest.mark.parametrize("sharded", [False, True], ids=["weights_h5", "orbax"])
def test_restore_repeats_the_draws_made_after_the_save(tmp_path, sharded):
    model = _model()
    _draws(model)  # The generators have moved on from their initial state.
    manager = ckpt_lib.CheckpointManager(str(tmp_path), sharded=sharded)
    manager.save(model, step=1)
    after_save = _draws(model)
    ckpt_lib.restore(model, manager.latest())
    again = _draws(model)
    # A second build of the model: other variable paths (seed_generator_<n>), same keys.
    other = _model()
    ckpt_lib.restore(other, manager.latest())
    for a, b, c in zip(after_save, again, _draws(other), strict=False):
        np.testing.assert_array_equal(a, b)
        np.testing.assert_array_equal(a, c)
    saved = json.load(open(manager.meta_path(1)))["seed_states"]
    assert list(saved) == ["dropout/seed_generator", "dropout_1/seed_generator"]
    assert all(counter == 3 for _, counter in saved.values()), saved  # three draws each


def test_a_checkpoint_without_seed_states_still_restores(tmp_path):
    model = _model()
    manager = ckpt_lib.CheckpointManager(str(tmp_path))
    manager.save(model, step=1)
    meta_path = manager.meta_path(1)
    meta = json.load(open(meta_path))
    del meta["seed_states"]  # As written before the states were recorded.
    ckpt_lib.atomic_write_text(meta_path, json.dumps(meta))
    _draws(model)
    before = ckpt_lib.read_seed_states(model)
    ckpt_lib.restore(model, manager.latest())
    assert ckpt_lib.read_seed_states(model) == before  # Nothing to restore: left as they are.


def test_other_seed_generators_are_a_config_error_naming_the_checkpoint(tmp_path):
    manager = ckpt_lib.CheckpointManager(str(tmp_path))
    manager.save(_model(rate=0.5), step=1)
    no_dropout = _model(rate=0.0)  # Same weights; a Dropout of rate 0 has no generator.
    with pytest.raises(TrainingConfigError) as error:
        ckpt_lib.restore(no_dropout, manager.latest())
    message = str(error.value)
    assert f"checkpoint {manager.weights_path(1)} does not match" in message
    assert "the model has 1, the checkpoint 2" in message
    assert "only in the checkpoint: dropout/seed_generator" in message
    # Evaluation restores without the random streams, so another dropout setting loads.
    ckpt_lib.restore(no_dropout, manager.latest(), seed_states=False)


def checkpoints_of_a_fit(directory):
    """Fits a two-Dropout model on 4 batches, checkpointing every 2 (at batch end).

    Returns:
        `({step: the generators' draw counters}, whether a restore into a new build of
        the model gives it the recorded states)`.
    """
    keras.utils.set_random_seed(0)
    model = _model()
    manager = ckpt_lib.CheckpointManager(directory, keep=2)
    model.fit(
        np.ones((8, 8)),
        np.zeros((8, 8)),
        batch_size=2,
        shuffle=False,
        verbose=0,
        callbacks=[ckpt_lib.StepCheckpoint(manager, every=2)],
    )
    counters = {
        str(m["step"]): sorted(c for _, c in m["seed_states"].values()) for m in manager.all()
    }
    other = _model()
    ckpt_lib.restore(other, manager.all()[0])
    return counters, ckpt_lib.read_seed_states(other) == manager.all()[0]["seed_states"]


def _in_jax(tmp_path):
    code = (
        "import json, sys; from tests.reliability.test_seed_state_resume import "
        "checkpoints_of_a_fit as f; print('RESULT', json.dumps(f(sys.argv[1])))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path)],
        cwd=helpers.REPO,
        env=helpers.env({"KERAS_BACKEND": "jax", "JAX_PLATFORMS": "cpu"}),
        capture_output=True,
        text=True,
        timeout=240,
    )
    lines = [line for line in result.stdout.splitlines() if line.startswith("RESULT ")]
    assert result.returncode == 0 and lines, result.stdout[-3000:] + result.stderr[-3000:]
    return tuple(json.loads(lines[-1][len("RESULT ") :]))


@pytest.mark.e2e
@pytest.mark.parametrize("backend", ["tensorflow", pytest.param("jax", marks=pytest.mark.jax)])
def test_a_checkpoint_at_batch_end_holds_the_states_of_that_step(tmp_path, backend):
    # JAX's fit keeps the state outside the variables between steps.
    counters, restored = (
        checkpoints_of_a_fit(str(tmp_path)) if backend == "tensorflow" else _in_jax(tmp_path)
    )
    assert counters == {"2": [2, 2], "4": [4, 4]}  # one draw per Dropout per step
    assert restored


def _losses(summary, first):
    return [loss for step, loss in summary["history"] if step > first]


@pytest.mark.slow
def test_resume_with_dropout_and_jitter_continues_like_an_uninterrupted_run(tmp_path):
    """A run killed after its first checkpoint (step EVERY) and restarted has the losses
    of the uninterrupted run (the killed run's folder: the uninterrupted run's without
    its last checkpoint)."""
    straight_dir, resumed_dir = str(tmp_path / "straight"), str(tmp_path / "resumed")
    straight = helpers.train_in_process(straight_dir, RUN)
    assert straight["end_step"] == STEPS
    shutil.copytree(straight_dir, resumed_dir)
    manager = ckpt_lib.CheckpointManager(os.path.join(resumed_dir, "checkpoints"))
    for path in (manager.weights_path(STEPS), manager.meta_path(STEPS)):
        os.remove(path)
    assert manager.latest()["step"] == EVERY
    states = manager.latest()["seed_states"]  # 15 dropouts (2 of them experts'), 2 routers
    assert len(states) == 17 and sum("router" in key for key in states) == 2, states

    resumed = helpers.train_in_process(resumed_dir, RUN)
    assert resumed["start_step"] == EVERY and resumed["end_step"] == STEPS
    expected = _losses(straight, EVERY)
    assert len(expected) == STEPS - EVERY
    # The same draws, data and weights: equal up to float rounding.
    np.testing.assert_allclose(_losses(resumed, EVERY), expected, rtol=1e-6, atol=0)
    # And the generators stand where the uninterrupted run's do.
    latest = [
        ckpt_lib.CheckpointManager(os.path.join(d, "checkpoints")).latest()
        for d in (straight_dir, resumed_dir)
    ]
    assert latest[0]["step"] == latest[1]["step"] == STEPS
    assert latest[0]["seed_states"] == latest[1]["seed_states"]
