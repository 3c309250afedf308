"""Test configuration: quiet TensorFlow/absl logs, TensorFlow backend unless told otherwise."""

import functools
import inspect
import logging
import os
import re
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


# What makes a test end to end (marked `e2e`, left out of `scripts/test.sh --fast`):
# a `slow` or `jax` mark, a shared long-lived subprocess (`xdist_group`), or a
# call in its body or its fixtures that starts a process or trains a whole job.
_E2E_MARKS = ("slow", "jax", "xdist_group")
_E2E_CALLS = re.compile(
    r"subprocess\.|\brun_cli(?:_here)?\(|\bcli_args\(|\btrain_in_process\(|"
    r"\brun_smoke\(|\bexec_here\(|(?:gin|train)_configurables\.train\(|"
    r"\b_run\(|\b_train\(|\bexport_for_serving\("
)


@functools.lru_cache(maxsize=None)
def _starts_a_job(function, depth=3):
    """Whether `function`, or a function of this project it calls (`depth` calls
    down), starts a process or trains a whole job (by its source)."""
    try:
        if _E2E_CALLS.search(inspect.getsource(function)):
            return True
    except (OSError, TypeError):
        return False
    if not depth:
        return False
    names = function.__code__.co_names
    found = []
    for name in names:
        value = function.__globals__.get(name)
        if inspect.ismodule(value):  # helpers.run_script: the module's functions it names
            found += [getattr(value, attr) for attr in names if hasattr(value, attr)]
        else:
            found.append(value)
    return any(
        inspect.isfunction(f)
        and f is not function
        and f.__module__.startswith("tests")
        and _starts_a_job(f, depth - 1)
        for f in found
    )


def _is_end_to_end(item):
    if any(item.get_closest_marker(name) for name in _E2E_MARKS):
        return True
    functions = [getattr(item, "function", None)]
    info = getattr(item, "_fixtureinfo", None)
    for defs in info.name2fixturedefs.values() if info else ():
        functions += [d.func for d in defs if d.baseid]  # this project's fixtures only
    return any(f is not None and _starts_a_job(f) for f in functions)


def pytest_collection_modifyitems(items):
    """Marks the end-to-end tests `e2e`. Tests marked `slow` run first, then those
    of an `xdist_group` (one long subprocess each), then the other end-to-end ones,
    so that pytest-xdist workers are not left waiting on one long test at the end
    (an unmarked end-to-end test that started last kept one worker busy 42 s
    after the other had finished)."""
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
