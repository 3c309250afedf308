"""Two local MultiWorkerMirroredStrategy workers == one worker; a dead peer fails, not hangs."""

import json
import os
import signal
import socket
import subprocess
import time

import numpy as np
import pytest

from tests.reliability import helpers
from tests.training.helpers import lines_in_background, wait_for_line

pytestmark = pytest.mark.slow

RUN = helpers.FAST + [
    "CheckpointConfig.every = 3",
    "train.collective_timeout = 30",
    "train.cluster_wait_timeout = 120",
]


def _free_ports(n):
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def _start_workers(model_dir, bindings):
    cluster = {"worker": [f"127.0.0.1:{p}" for p in _free_ports(2)]}
    procs = []
    for index in range(2):
        tf_config = json.dumps({"cluster": cluster, "task": {"type": "worker", "index": index}})
        procs.append(
            subprocess.Popen(
                helpers.cli_args(model_dir, bindings + ['train.strategy = "multi_worker"']),
                cwd=helpers.REPO,
                env=helpers.env({"TF_CONFIG": tf_config}),
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
        )
    return procs


def test_two_workers_match_one_worker_with_the_same_global_batch(tmp_path):
    # Routing groups and expert capacity are per replica: with one group per
    # sequence and capacity for every token, 1 x 8 and 2 x 4 examples route
    # alike (a batch-wide group would give each replica its own load-balancing
    # loss, a few 1e-5 of the loss here).
    bindings = RUN + [
        "TRAIN_STEPS = 6",
        "train.summary_batches = 1",
        'SwitchFeedForward.group_size = "sequence"',
        "SwitchFeedForward.train_capacity_factor = 4.0",
        "SwitchFeedForward.eval_capacity_factor = 4.0",
    ]
    procs = _start_workers(str(tmp_path / "mwms"), bindings)
    single = subprocess.Popen(
        helpers.cli_args(str(tmp_path / "single"), bindings),
        cwd=helpers.REPO,
        env=helpers.env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    outputs = []
    try:
        for proc in procs + [single]:
            outputs.append(proc.communicate(timeout=280)[0])
    finally:
        for proc in procs + [single]:
            if proc.poll() is None:
                proc.kill()
    for proc, out in zip(procs + [single], outputs, strict=False):
        assert proc.returncode == 0, out[-5000:]
    for out in outputs[:2]:
        assert "strategy multi_worker (" in out and "2 replica(s)" in out, out[-5000:]
    multi = json.load(open(tmp_path / "mwms" / "summary.json"))
    one = json.load(open(tmp_path / "single" / "summary.json"))
    assert multi["replicas"] == 2 and multi["end_step"] == one["end_step"] == 6
    assert os.path.isfile(tmp_path / "mwms" / "checkpoints" / "ckpt-00000006.weights.h5")
    assert multi["eval_end"] is not None  # evaluate works under MWMS too.
    np.testing.assert_allclose(
        [loss for _, loss in multi["history"]], [loss for _, loss in one["history"]], rtol=1e-5
    )
    step_a, weights_a, _ = helpers.final_weights(str(tmp_path / "mwms"), bindings)
    step_b, weights_b, _ = helpers.final_weights(str(tmp_path / "single"), bindings)
    assert step_a == step_b == 6
    flat_a = np.concatenate([w.ravel() for w in weights_a])
    flat_b = np.concatenate([w.ravel() for w in weights_b])
    change = np.linalg.norm(flat_a - flat_b) / np.linalg.norm(flat_b)
    assert change < 1e-5, change


def test_a_dead_worker_makes_the_other_fail_clearly_not_hang(tmp_path):
    procs = _start_workers(
        str(tmp_path / "mwms"), RUN + ["TRAIN_STEPS = 100000", "train.summary_batches = 0"]
    )
    survivor, victim = procs
    lines = lines_in_background(survivor.stdout)
    try:
        # Wait until training really runs; a silent hang fails at the deadline.
        wait_for_line(
            lines,
            r"\[keras_moe\] step \d+/",
            time.monotonic() + 200,
            "the workers did not start training",
        )
        victim.send_signal(signal.SIGKILL)
        t_kill = time.monotonic()
        try:
            survivor.wait(timeout=300)  # a safety net only; the bound is asserted below
        except subprocess.TimeoutExpired:
            pytest.fail("the survivor still runs 300 s after its peer died")
        waited = time.monotonic() - t_kill
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
    rest = []
    while (line := lines.get(timeout=30)) is not None:
        rest.append(line)
    rest = "".join(rest)
    assert survivor.returncode == 4, rest[-5000:]
    assert "a peer worker probably died" in rest, rest[-5000:]
    # train.collective_timeout = 30 s bounds the stuck collective; the rest is
    # the error report and shutdown. A survivor that waited for the 600 s
    # default, or for the peer forever, fails here.
    assert waited < 30 + 60, f"the survivor took {waited:.0f} s to fail"
