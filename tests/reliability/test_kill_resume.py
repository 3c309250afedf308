"""SIGKILL at a seeded random point, restart with the same command: same data, same weights.

The restart reports where it resumed, logs only the steps after it, and its
summary.json records the resumed and the final step.

Every consumed training batch is fingerprinted to a file (`train.record_batches`,
written when the training loop takes the batch), so the test counts the data
directly: the killed run's batches up to its last checkpoint followed by the
resumed run's batches must be exactly the uninterrupted run's sequence, and
only the batches after that checkpoint (at most CheckpointConfig.every, plus the one
in flight) are seen twice.
"""

import json
import random
import re
import signal
import subprocess
import time

import numpy as np
import pytest

from tests.reliability import helpers

pytestmark = pytest.mark.slow

STEPS = 16
EVERY = 4


def _bindings(record):
    return helpers.FAST + [
        f"TRAIN_STEPS = {STEPS}",
        f"CheckpointConfig.every = {EVERY}",
        f"train.record_batches = '{record}'",
    ]


def test_sigkill_at_a_random_point_then_restart_continues_exactly(tmp_path):
    kill_at = random.Random(2024).randint(EVERY + 1, STEPS - 2)  # batches consumed at the kill
    straight_dir, killed_dir = tmp_path / "straight", tmp_path / "killed"
    straight_rec, killed_rec = tmp_path / "straight.batches", tmp_path / "killed.batches"
    straight = subprocess.Popen(
        helpers.cli_args(straight_dir, _bindings(straight_rec)),
        cwd=helpers.REPO,
        env=helpers.env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    victim = subprocess.Popen(
        helpers.cli_args(killed_dir, _bindings(killed_rec)),
        cwd=helpers.REPO,
        env=helpers.env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.time() + 240
        while len(helpers.read_lines(killed_rec)) < kill_at:
            assert victim.poll() is None, "the run ended before the kill point"
            assert time.time() < deadline, "no progress within 240 s"
            time.sleep(0.02)
        victim.send_signal(signal.SIGKILL)
        victim.wait(timeout=30)
        straight_out, _ = straight.communicate(timeout=240)
    finally:
        for proc in (victim, straight):
            if proc.poll() is None:
                proc.kill()
    assert straight.returncode == 0, straight_out[-3000:]
    before = helpers.read_lines(killed_rec)
    assert victim.returncode == -signal.SIGKILL and len(before) < STEPS

    result = helpers.run(killed_dir, _bindings(killed_rec))  # The same command again.
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    match = re.search(
        r"resumed from checkpoint (\S+) at step (\d+) \(skipping (\d+) consumed", result.stdout
    )
    assert match, result.stdout[-3000:]
    resumed_at = int(match.group(2))
    assert resumed_at % EVERY == 0 and resumed_at == int(match.group(3))
    assert match.group(1).endswith(f"ckpt-{resumed_at:08d}.weights.h5")
    # The newest checkpoint: every step the killed run completed, rounded down.
    assert len(before) - EVERY - 1 <= resumed_at <= len(before), (resumed_at, len(before))
    logged = [int(s) for s in re.findall(r"\[keras_moe\] step (\d+)/", result.stdout)]
    assert logged and min(logged) > resumed_at and logged[-1] == STEPS, logged
    summary = json.load(open(killed_dir / "summary.json"))
    assert summary["start_step"] == resumed_at and summary["end_step"] == STEPS

    reference = helpers.read_lines(straight_rec)
    after = helpers.read_lines(killed_rec)[len(before) :]
    assert len(reference) == STEPS and len(set(reference)) == STEPS
    assert before[:resumed_at] + after == reference  # nothing lost, nothing out of order
    repeated = len(before) - resumed_at
    assert repeated <= EVERY + 1  # only work after the last checkpoint is redone

    step_a, weights_a, opt_a = helpers.final_weights(straight_dir, _bindings(straight_rec))
    step_b, weights_b, opt_b = helpers.final_weights(killed_dir, _bindings(killed_rec))
    assert step_a == step_b == STEPS
    for a, b in zip(weights_a + opt_a, weights_b + opt_b, strict=False):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)
