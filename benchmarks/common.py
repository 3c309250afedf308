"""Shared helpers for the benchmarks: timing, environment facts, result files."""

import json
import os
import platform
import statistics
import time

RESULTS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
# `--smoke` runs write here (git-ignored), never over the committed results.
SMOKE_DIR = os.path.join(RESULTS_DIR, "smoke")


def use_smoke_results():
    """Sends this process's result files to `results/smoke/`: a `--smoke` run checks that
    a benchmark runs, and its tiny numbers must not replace the committed ones."""
    global RESULTS_DIR
    RESULTS_DIR = SMOKE_DIR


def environment():
    """Facts that make a result interpretable later."""
    import keras

    backend = keras.backend.backend()
    facts = {
        "python": platform.python_version(),
        "machine": platform.machine(),
        "cpu_count": os.cpu_count(),
        "keras": keras.__version__,
        "backend": backend,
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    if backend == "jax":  # may run where TensorFlow is not installed
        import jax

        facts.update(
            jax=jax.__version__, gpus=[d.device_kind for d in jax.devices() if d.platform == "gpu"]
        )
    else:
        import tensorflow as tf

        facts.update(
            tensorflow=tf.__version__, gpus=[d.name for d in tf.config.list_physical_devices("GPU")]
        )
    return facts


def interleaved_medians(functions, repeats, warmup=2):
    """Times each callable `repeats` times, interleaving them so that machine
    noise hits all of them alike. Returns {name: {"median": s, "spread": s}}."""
    for fn in functions.values():
        for _ in range(warmup):
            fn()
    samples = {name: [] for name in functions}
    for _ in range(repeats):
        for name, fn in functions.items():
            start = time.perf_counter()
            fn()
            samples[name].append(time.perf_counter() - start)
    return {
        name: {
            "median": statistics.median(values),
            "spread": (max(values) - min(values)) / 2,
            "samples": values,
        }
        for name, values in samples.items()
    }


def result_path(name):
    return os.path.join(RESULTS_DIR, f"{name}.json")


def read_result(name):
    """The payload `write_result(name, ...)` wrote, or None if there is none."""
    path = result_path(name)
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return json.load(f)


def write_result(name, payload):
    os.makedirs(RESULTS_DIR, exist_ok=True)
    path = result_path(name)
    with open(path + ".tmp", "w") as f:
        json.dump(payload, f, indent=2, sort_keys=True)
    os.replace(path + ".tmp", path)
    return path
