"""Shared pieces of the reliability tests: tiny runs, subprocess CLI runs, batch records."""

import os
import subprocess
import sys

from tests.training.helpers import REPO, TINY, cli_bindings, parse  # noqa: F401

# One fast configuration for every subprocess run: SGD (exact resume), no summary pass.
FAST = [
    "CheckpointConfig.every = 4",
    "train.summary_batches = 0",
    "make_optimizer.name = 'sgd'",
    "make_optimizer.learning_rate = 0.5",
    "train.log_every = 1",
    "CheckpointConfig.keep = 3",
]


def env(extra=None):
    out = dict(os.environ)
    out.update(
        {
            "PYTHONPATH": REPO,
            "TF_CPP_MIN_LOG_LEVEL": "3",
            "PYTHONUNBUFFERED": "1",
            "KERAS_BACKEND": "tensorflow",
            "TF_ENABLE_ONEDNN_OPTS": "0",
        }
    )
    out.pop("TF_CONFIG", None)
    out.update(extra or {})
    return out


def cli_args(model_dir, bindings):
    return [
        sys.executable,
        "-m",
        "keras_moe.training",
        "--gin_file=tiny_local.gin",
        f"--model_dir={model_dir}",
    ] + cli_bindings(list(bindings))


def run(model_dir, bindings, timeout=240, extra_env=None):
    return subprocess.run(
        cli_args(model_dir, bindings),
        cwd=REPO,
        env=env(extra_env),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def read_lines(path):
    if not os.path.exists(path):
        return []
    with open(path, encoding="utf-8") as f:
        return [line.strip() for line in f if line.strip()]


def train_in_process(model_dir, bindings=(), **kwargs):
    from keras_moe.training import train_configurables

    parse(list(bindings))
    kwargs.setdefault("tensorboard", False)
    kwargs.setdefault("verbose", 0)
    return train_configurables.train(
        str(model_dir), write_config=train_configurables.write_operative_config, **kwargs
    )


def final_weights(model_dir, bindings=()):
    """(step, model weights, optimizer variables) of the newest checkpoint in model_dir."""
    from keras_moe.training import checkpoint as ckpt_lib
    from keras_moe.training import train_configurables, trainer

    parse(list(bindings))
    meta = ckpt_lib.CheckpointManager(os.path.join(model_dir, "checkpoints")).latest()
    model = trainer.build_compiled_model(optimizer=train_configurables.make_optimizer)
    ckpt_lib.restore(model, meta)
    return (
        int(model.optimizer.iterations.numpy()),
        [v.numpy() for v in model.weights],
        [v.numpy() for v in model.optimizer.variables],
    )
