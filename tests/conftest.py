"""Test configuration: quiet TensorFlow/absl logs, TensorFlow backend unless told otherwise."""

import functools
import logging
import os
import sys
import warnings

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")
# The compiled searches on JAX would cache their compilations in the user's home;
# the test that checks that cache turns it on in a directory of its own.
os.environ.setdefault("KERAS_MOE_JAX_CACHE", "off")

import numpy as np
import pytest

# Two logical CPU devices, so that strategy tests can run in-process. This
# must happen before TensorFlow initialises its runtime.
import tensorflow as tf

_cpus = tf.config.list_physical_devices("CPU")
tf.config.set_logical_device_configuration(_cpus[0], [tf.config.LogicalDeviceConfiguration()] * 2)

from keras_moe.training.run import training_run  # noqa: E402  (after the devices)

logging.getLogger("absl").setLevel(logging.ERROR)
logging.getLogger("tensorflow").setLevel(logging.ERROR)
warnings.filterwarnings("ignore", category=DeprecationWarning)


@pytest.fixture(scope="session")
def two_cpu_strategy():
    """One MirroredStrategy over the two logical CPUs, shared by the whole session.

    A second MirroredStrategy over the same devices in one process makes
    TensorFlow's collectives fail with a shape mismatch, so tests share this one.
    """
    return tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])


@pytest.fixture
def rng():
    return np.random.default_rng(1234)


@pytest.fixture(autouse=True)
def _reset_keras_state():
    import keras

    keras.mixed_precision.set_global_policy("float32")
    yield
    keras.mixed_precision.set_global_policy("float32")


# End-to-end tests (left out of `scripts/test.sh --fast`) say so: `e2e` on a test that
# starts a process, trains a whole job or exports a SavedModel; `slow`, `jax` and
# `xdist_group` (one long-lived subprocess per group) imply it.
END_TO_END_MARKS = ("e2e", "slow", "jax", "xdist_group")
# The audit events (PEP 578) by which Python starts another process.
_PROCESS_EVENTS = frozenset(
    {
        "subprocess.Popen",
        "os.system",
        "os.posix_spawn",
        "os.fork",
        "os.forkpty",
        "os.exec",
        "os.spawn",
        "pty.spawn",
    }
)
_unmarked_test = None  # the running test's id while it carries no end-to-end mark


def _is_end_to_end(item):
    return any(item.get_closest_marker(name) for name in END_TO_END_MARKS)


def _refuse_unmarked(what):
    pytest.fail(
        f"{_unmarked_test} {what} but is not marked end to end: decorate it with "
        "@pytest.mark.e2e (or set `pytestmark = pytest.mark.e2e` in its module), "
        "so that `scripts/test.sh --fast` leaves it out",
        pytrace=False,
    )


def _refuse_processes_of_unmarked_tests(event, args):
    if _unmarked_test is not None and event in _PROCESS_EVENTS:
        _refuse_unmarked(f"starts a process ({event})")


sys.addaudithook(_refuse_processes_of_unmarked_tests)


@pytest.fixture(autouse=True)
def _refuse_end_to_end_work_in_unmarked_tests(request, monkeypatch):
    """A test without an end-to-end mark fails where it starts a process or trains a
    whole job, naming the mark it lacks."""
    global _unmarked_test
    if _is_end_to_end(request.node):
        yield
        return

    @functools.wraps(training_run.Run.fit)
    def refuse_training(*args, **kwargs):
        _refuse_unmarked("trains a whole job (Run.fit)")

    monkeypatch.setattr(training_run.Run, "fit", refuse_training)
    _unmarked_test = request.node.nodeid
    try:
        yield
    finally:
        _unmarked_test = None


def pytest_collection_modifyitems(items):
    """Marks the tests that `slow`, `jax` or `xdist_group` make end to end `e2e` too.
    Tests marked `slow` run first, then those of an `xdist_group` (one long
    subprocess each), then the other end-to-end ones, so that pytest-xdist workers
    are not left waiting on one long test at the end (an unmarked end-to-end test
    that started last kept one worker busy 42 s after the other had finished)."""
    for item in items:
        if _is_end_to_end(item):
            item.add_marker(pytest.mark.e2e)
    items.sort(
        key=lambda item: (
            item.get_closest_marker("slow") is None,
            item.get_closest_marker("xdist_group") is None,
            item.get_closest_marker("e2e") is None,
        )
    )
