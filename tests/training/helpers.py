"""Shared tiny configuration and subprocess helpers for the training tests."""

import os
import queue
import re
import subprocess
import sys
import threading
import time

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# A very small Switch model and short sequences: a step takes milliseconds.
TINY = [
    "T5Config.d_model = 32",
    "T5Config.num_heads = 2",
    "T5Config.d_kv = 16",
    "T5Config.d_ff = 64",
    "SwitchFeedForward.d_ff = 64",
    "SwitchFeedForward.num_experts = 4",
    'TASK_FEATURE_LENGTHS = {"inputs": 64, "targets": 14}',
    "BATCH_SIZE = 8",
    "train.log_every = 5",
    "train.summary_batches = 2",
    "train.expert_load_every = 0",
]


def parse(bindings=(), files=("tiny_local.gin",)):
    import gin
    from keras_moe.gin_config import parse_gin

    gin.clear_config()
    parse_gin(list(files), TINY + list(bindings))


def run_cli(args, timeout, env=None, module="keras_moe.training"):
    """Runs a CLI in a subprocess from the repository root; returns CompletedProcess."""
    full_env = dict(os.environ)
    full_env.update(
        {
            "PYTHONPATH": REPO + os.pathsep + full_env.get("PYTHONPATH", ""),
            "TF_CPP_MIN_LOG_LEVEL": "3",
            "PYTHONUNBUFFERED": "1",
        }
    )
    full_env.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", module] + list(args),
        cwd=REPO,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def run_cli_here(args, main=None):
    """`keras-moe-train args` (or another CLI's `main`) in this process: what `run_cli`
    does without starting TensorFlow again. Returns a CompletedProcess with the exit
    status and what Python wrote to stdout and stderr; gin is cleared before and after."""
    import contextlib
    import io

    import gin

    if main is None:
        from keras_moe.training.train_cli import main
    out, err = io.StringIO(), io.StringIO()
    gin.clear_config()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main(list(args))
    finally:
        gin.clear_config()
    return subprocess.CompletedProcess(list(args), code, out.getvalue(), err.getvalue())


def cli_bindings(bindings):
    out = []
    for b in TINY + list(bindings):
        out.append(f"--gin_bindings={b}")
    return out


def lines_in_background(stream):
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


def wait_for_line(lines, pattern, deadline, what):
    """The first match of `pattern` in the next lines; fails at `deadline` or end of output."""
    seen = []
    while True:
        try:
            line = lines.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            pytest.fail(
                f"{what}: nothing matched {pattern!r} in time; last output:\n" + "".join(seen[-40:])
            )
        if line is None:
            pytest.fail(f"{what}: output ended; last output:\n" + "".join(seen[-40:]))
        seen.append(line)
        match = re.search(pattern, line)
        if match:
            return match
