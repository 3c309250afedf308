"""Runs one benchmark script at its `--smoke` size and reads back what it wrote."""

import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run_smoke(script, output, *extra, extensions=("json",)):
    """Returns {extension: parsed JSON (json) or True (other files that exist)}.

    The files are removed afterwards, so smoke runs never touch the committed results.
    """
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", JAX_PLATFORMS="cpu")
    cmd = [sys.executable, os.path.join(ROOT, "benchmarks", script), "--smoke",
           "--output", output, *extra]
    result = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
    found = {}
    for ext in extensions:
        path = os.path.join(ROOT, "benchmarks", "results", f"{output}.{ext}")
        if not os.path.exists(path):
            continue
        if ext == "json":
            with open(path) as f:
                found[ext] = json.load(f)
        else:
            found[ext] = True
        os.remove(path)
    return found
