"""Test configuration: quiet TensorFlow/absl logs, TensorFlow backend unless told otherwise."""

import logging
import os
import warnings

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")

import numpy as np
import pytest

# Two logical CPU devices, so that strategy tests can run in-process. This
# must happen before TensorFlow initialises its runtime.
import tensorflow as tf

_cpus = tf.config.list_physical_devices("CPU")
tf.config.set_logical_device_configuration(
    _cpus[0], [tf.config.LogicalDeviceConfiguration()] * 2
)

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


def pytest_collection_modifyitems(items):
    """Tests marked `slow` run first, those of an `xdist_group` (one long
    subprocess each) before the rest, so that pytest-xdist workers are not left
    waiting on one long test at the end."""
    items.sort(key=lambda item: (item.get_closest_marker("slow") is None,
                                 item.get_closest_marker("xdist_group") is None))
