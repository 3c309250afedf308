"""Shared tiny configuration for the training tests."""

import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# A very small Switch model and short sequences: a step takes milliseconds.
TINY = [
    "D_MODEL = 32", "NUM_HEADS = 2", "D_KV = 16", "D_FF = 64", "NUM_EXPERTS = 4",
    'TASK_FEATURE_LENGTHS = {"inputs": 64, "targets": 14}', "BATCH_SIZE = 8",
    "LOG_EVERY = 5", "SUMMARY_BATCHES = 2", "EXPERT_LOAD_EVERY = 0",
]


def parse(bindings=(), files=("tiny_local.gin",)):
    import gin

    from keras_moe.training import config

    gin.clear_config()
    config.parse_gin(list(files), TINY + list(bindings))


def run_cli(args, timeout, env=None, module="keras_moe.training"):
    """Runs a CLI in a subprocess from the repository root; returns CompletedProcess."""
    full_env = dict(os.environ)
    full_env.update({"PYTHONPATH": REPO + os.pathsep + full_env.get("PYTHONPATH", ""),
                     "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONUNBUFFERED": "1"})
    full_env.update(env or {})
    return subprocess.run([sys.executable, "-m", module] + list(args), cwd=REPO, env=full_env,
                          capture_output=True, text=True, timeout=timeout)


def cli_bindings(bindings):
    out = []
    for b in TINY + list(bindings):
        out.append(f"--gin_bindings={b}")
    return out
