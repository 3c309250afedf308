"""Runs one benchmark script at its `--smoke` size and reads back what it wrote."""

import hashlib
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RESULTS = os.path.join(ROOT, "benchmarks", "results")
SMOKE_RESULTS = os.path.join(RESULTS, "smoke")


def _committed_results():
    """{file name: sha256} of the result files beside the smoke folder."""
    out = {}
    for name in sorted(os.listdir(RESULTS)):
        path = os.path.join(RESULTS, name)
        if os.path.isfile(path):
            with open(path, "rb") as f:
                out[name] = hashlib.sha256(f.read()).hexdigest()
    return out


def _run_in_this_process(script, argv):
    """`benchmarks/<script>`'s `main(argv)` here, with `sys.argv` as the command line would
    set it; the process-wide settings a benchmark changes are put back afterwards."""
    import importlib

    import keras

    from benchmarks import common

    module = importlib.import_module(f"benchmarks.{script[: -len('.py')]}")
    argv_before, results_dir = sys.argv, common.RESULTS_DIR
    policy, torch_threads = keras.mixed_precision.global_policy().name, _torch_threads()
    sys.argv = [os.path.join(ROOT, "benchmarks", script), *argv]
    try:
        module.main(argv)
    finally:
        sys.argv, common.RESULTS_DIR = argv_before, results_dir
        keras.mixed_precision.set_global_policy(policy)
        if torch_threads is not None:
            sys.modules["torch"].set_num_threads(torch_threads)


def _torch_threads():
    """torch's thread count if a benchmark has imported torch, else None."""
    torch = sys.modules.get("torch")
    return torch.get_num_threads() if torch is not None else None


def run_smoke(
    script, output, *extra, extensions=("json",), default_output=False, own_process=False
):
    """Returns {extension: parsed JSON (json) or True (other files that exist)}.

    A smoke run writes under `benchmarks/results/smoke/` and must leave the
    committed results as they were (checked here); its files are removed
    afterwards. `default_output`: run without `--output`, as a user would;
    `output` is then the script's default result name. The script's `main()`
    runs in this process (its own subprocesses aside), which spares a
    TensorFlow start and the tracing this process has already done;
    `own_process`: run `python benchmarks/<script>` as a user types it.
    """
    argv = ["--smoke"]
    if not default_output:
        argv += ["--output", output]
    argv += list(extra)
    before = _committed_results()
    if own_process:
        env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", JAX_PLATFORMS="cpu")
        result = subprocess.run(
            [sys.executable, os.path.join(ROOT, "benchmarks", script)] + argv,
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
    else:
        _run_in_this_process(script, argv)
    assert _committed_results() == before, "a smoke run changed benchmarks/results/"
    found = {}
    for ext in extensions:
        path = os.path.join(SMOKE_RESULTS, f"{output}.{ext}")
        if not os.path.exists(path):
            continue
        if ext == "json":
            with open(path) as f:
                found[ext] = json.load(f)
        else:
            found[ext] = True
        os.remove(path)
    return found
