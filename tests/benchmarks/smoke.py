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


def run_smoke(script, output, *extra, extensions=("json",), default_output=False):
    """Returns {extension: parsed JSON (json) or True (other files that exist)}.

    A smoke run writes under `benchmarks/results/smoke/` and must leave the
    committed results as they were (checked here); its files are removed
    afterwards. `default_output`: run without `--output`, as a user would;
    `output` is then the script's default result name.
    """
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", JAX_PLATFORMS="cpu")
    cmd = [sys.executable, os.path.join(ROOT, "benchmarks", script), "--smoke"]
    if not default_output:
        cmd += ["--output", output]
    before = _committed_results()
    result = subprocess.run(cmd + list(extra), cwd=ROOT, env=env, capture_output=True,
                            text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
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
