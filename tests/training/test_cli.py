"""The CLIs in subprocesses: kill + restart resumes; 2-worker MultiWorkerMirroredStrategy; errors."""

import json
import os
import queue
import re
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest

from tests.training.helpers import REPO, cli_bindings, run_cli


def _env():
    env = dict(os.environ)
    env.update({"PYTHONPATH": REPO, "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONUNBUFFERED": "1"})
    env.pop("TF_CONFIG", None)
    return env


def _lines_in_background(stream):
    """A queue fed with `stream`'s lines by a thread (None at the end of the stream).

    Waiting on the queue with a timeout gives a real deadline: iterating over
    the stream itself blocks until a line arrives, so a silent hang would never
    reach the deadline check.
    """
    lines = queue.Queue()

    def read():
        for line in stream:
            lines.put(line)
        lines.put(None)

    threading.Thread(target=read, daemon=True).start()
    return lines


def _wait_for_line(lines, pattern, deadline, what):
    """The first match of `pattern` in the next lines; fails at `deadline` or end of output."""
    seen = []
    while True:
        try:
            line = lines.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            pytest.fail(f"{what}: nothing matched {pattern!r} in time; last output:\n"
                        + "".join(seen[-40:]))
        if line is None:
            pytest.fail(f"{what}: output ended; last output:\n" + "".join(seen[-40:]))
        seen.append(line)
        match = re.search(pattern, line)
        if match:
            return match


def test_line_wait_fails_at_its_deadline_on_a_silent_process():
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                            stdout=subprocess.PIPE, text=True)
    try:
        start = time.monotonic()
        with pytest.raises(pytest.fail.Exception, match="in time"):
            _wait_for_line(_lines_in_background(proc.stdout), "never", start + 1.0, "sleeper")
        assert time.monotonic() - start < 10
    finally:
        proc.kill()
        proc.wait(timeout=30)


def test_killed_run_resumes_from_its_last_checkpoint(tmp_path):
    model_dir = str(tmp_path / "run")
    args = [sys.executable, "-m", "keras_moe.training", "--gin_file=tiny_local.gin",
            f"--model_dir={model_dir}"] + cli_bindings(
                ["TRAIN_STEPS = 400", "CHECKPOINT_EVERY = 5", "SUMMARY_BATCHES = 0"])
    proc = subprocess.Popen(args, cwd=REPO, env=_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    saved = []
    lines = _lines_in_background(proc.stdout)
    deadline = time.monotonic() + 180
    try:
        while not saved or saved[-1] < 10:
            match = _wait_for_line(lines, r"saved checkpoint .*ckpt-(\d+)\.weights\.h5",
                                   deadline, "checkpoint 10 within 180 s")
            saved.append(int(match.group(1)))
    finally:
        proc.kill()  # SIGKILL: no chance to clean up.
        proc.wait(timeout=30)
    assert saved and saved[-1] >= 10, saved
    last = saved[-1]
    result = run_cli(["--gin_file=tiny_local.gin", f"--model_dir={model_dir}"] + cli_bindings(
        [f"TRAIN_STEPS = {last + 5}", "CHECKPOINT_EVERY = 5", "SUMMARY_BATCHES = 0"]),
        timeout=240)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    out = result.stdout
    match = re.search(r"resumed from checkpoint (\S+) at step (\d+)", out)
    assert match, out[-3000:]
    resumed_step = int(match.group(2))
    assert resumed_step >= last  # the newest committed checkpoint (maybe one newer than seen)
    steps = [int(s) for s in re.findall(r"\[keras_moe\] step (\d+)/", out)]
    assert steps and min(steps) > resumed_step and steps[-1] == last + 5, steps
    summary = json.load(open(os.path.join(model_dir, "summary.json")))
    assert summary["start_step"] == resumed_step and summary["end_step"] == last + 5


def _free_ports(n):
    socks, ports = [], []
    for _ in range(n):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        socks.append(s)
        ports.append(s.getsockname()[1])
    for s in socks:
        s.close()
    return ports


def test_two_worker_multi_worker_mirrored_run_completes(tmp_path):
    ports = _free_ports(2)
    cluster = {"worker": [f"127.0.0.1:{p}" for p in ports]}
    procs = []
    model_dir = str(tmp_path / "mwms")
    for index in range(2):
        env = _env()
        env["TF_CONFIG"] = json.dumps({"cluster": cluster, "task": {"type": "worker",
                                                                  "index": index}})
        args = [sys.executable, "-m", "keras_moe.training", "--gin_file=tiny_local.gin",
                f"--model_dir={model_dir}"] + cli_bindings(
                    ["TRAIN_STEPS = 4", "CHECKPOINT_EVERY = 2", 'STRATEGY = "multi_worker"',
                     "SUMMARY_BATCHES = 1"])
        procs.append(subprocess.Popen(args, cwd=REPO, env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True))
    outputs = []
    try:
        for proc in procs:
            out, _ = proc.communicate(timeout=300)
            outputs.append(out)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
    for index, (proc, out) in enumerate(zip(procs, outputs)):
        assert proc.returncode == 0, f"worker {index}:\n{out[:6000]}"
        assert "strategy multi_worker (" in out and "2 replica(s)" in out
    summary = json.load(open(os.path.join(model_dir, "summary.json")))
    assert summary["replicas"] == 2 and summary["end_step"] == 4
    assert os.path.isfile(os.path.join(model_dir, "checkpoints", "ckpt-00000004.weights.h5"))


@pytest.mark.parametrize("extra,message", [
    (["--gin_bindings=BATCH_SIZ = 4"], "macro 'BATCH_SIZ' is not defined"),
    (["--gin_bindings=MIXTURE_OR_TASK_NAME = 'no_such_task'"], "no_such_task"),
    (["--gin_file=missing_run.gin"], "missing_run.gin"),
])
def test_cli_errors_name_the_problem_and_write_nothing(tmp_path, extra, message):
    from keras_moe.training import cli

    model_dir = tmp_path / "run"
    files = [] if any(e.startswith("--gin_file") for e in extra) else ["--gin_file=tiny_local.gin"]
    code = cli.main(files + extra + [f"--model_dir={model_dir}"])
    assert code == 2
    assert not model_dir.exists() or os.listdir(model_dir) == []


def test_cli_error_message_for_bad_model_dir(tmp_path, capsys):
    from keras_moe.training import cli

    a_file = tmp_path / "not_a_dir"
    a_file.write_text("keep me")
    assert cli.main(["--gin_file=tiny_local.gin", f"--model_dir={a_file}"]) == 2
    assert "is not a folder" in capsys.readouterr().err
    assert a_file.read_text() == "keep me"
