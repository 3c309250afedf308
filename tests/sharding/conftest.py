"""Runs the JAX and TensorFlow multi-device check scripts once per session.

Both scripts need a fresh process (backend and device count are fixed when
the framework initialises), so they run as subprocesses, each started on the
first use of its result. Under pytest-xdist each script's tests form one
`xdist_group` (see the test modules), so one worker runs each script once.
"""

import json
import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPTS = {
    # PJRT_NPROC: XLA's CPU client runs each device's program on a pool of
    # max(cores, devices) threads; with exactly one thread per device, steps
    # queued by async dispatch can leave a collective one device short and hang
    # (docs/sharding.md). The longer collective limit covers a loaded 2-core
    # machine; the script's own deadline (TIMEOUT_S) still bounds the run.
    "jax": (
        "jax_checks.py",
        {
            "KERAS_BACKEND": "jax",
            "PJRT_NPROC": "16",
            "XLA_FLAGS": "--xla_force_host_platform_device_count=8 "
            "--xla_cpu_collective_call_terminate_timeout_seconds=400",
            "JAX_PLATFORMS": "cpu",
        },
    ),
    "tf": ("tf_checks.py", {"KERAS_BACKEND": "tensorflow"}),
    "exchange": (
        "exchange_checks.py",
        {
            "KERAS_BACKEND": "jax",
            "PJRT_NPROC": "16",
            "XLA_FLAGS": "--xla_force_host_platform_device_count=8",
            "JAX_PLATFORMS": "cpu",
        },
    ),
}
TIMEOUT_S = 420


class _Run:
    def __init__(self, script, extra_env):
        env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", **extra_env)
        self.proc = subprocess.Popen(
            [sys.executable, os.path.join(HERE, script)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self._result = None

    def result(self):
        if self._result is None:
            try:
                stdout, stderr = self.proc.communicate(timeout=TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                stdout, stderr = self.proc.communicate()
            lines = [ln for ln in stdout.splitlines() if ln.startswith("RESULT ")]
            if self.proc.returncode != 0 or not lines:
                pytest.fail(
                    f"check script failed (rc={self.proc.returncode}):\n"
                    f"{stdout[-3000:]}\n{stderr[-6000:]}"
                )
            self._result = json.loads(lines[-1][len("RESULT ") :])
        return self._result


@pytest.fixture(scope="session")
def _sharding_runs():
    runs = {}
    yield runs
    for run in runs.values():
        if run.proc.poll() is None:
            run.proc.kill()


def _result(runs, name):
    if name not in runs:
        runs[name] = _Run(*SCRIPTS[name])
    return runs[name].result()


@pytest.fixture(scope="session")
def jax_result(_sharding_runs):
    return _result(_sharding_runs, "jax")


@pytest.fixture(scope="session")
def tf_result(_sharding_runs):
    return _result(_sharding_runs, "tf")


@pytest.fixture(scope="session")
def exchange_result(_sharding_runs):
    return _result(_sharding_runs, "exchange")
