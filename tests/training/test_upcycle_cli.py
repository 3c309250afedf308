"""`keras-moe-train --gin_file=upcycle.gin`: a dense run's checkpoint starts a MoE run.

The two commands are the README's (section 5), shortened by gin bindings and with
temporary folders: the first as a user types it, the others through the same
`main()` in this process (a TensorFlow start each spared).
"""

import json
import os
import shlex
import shutil
import subprocess

import pytest

from tests.docs.test_readme_snippets import README, REPO, code_blocks
from tests.training.helpers import run_cli_here

SMALL = [
    "T5Config.d_model = 32",
    "T5Config.num_heads = 2",
    "T5Config.d_kv = 16",
    "T5Config.d_ff = 64",
    'TASK_FEATURE_LENGTHS = {"inputs": 64, "targets": 14}',
    "BATCH_SIZE = 8",
    "train.log_every = 1",
    "train.summary_batches = 2",
    "train.expert_load_every = 0",
    "CheckpointConfig.every = 2",
]


def _flags(bindings):
    return [f"--gin_bindings={b}" for b in bindings]


def _run(args):
    executable = shutil.which("keras-moe-train")
    assert executable, "keras-moe-train is not on PATH: install the package (scripts/install.sh)"
    env = dict(os.environ, PYTHONPATH=REPO, PYTHONUNBUFFERED="1")
    return subprocess.run(
        [executable] + args, cwd=REPO, env=env, capture_output=True, text=True, timeout=400
    )


@pytest.mark.e2e
def test_the_readme_upcycles_a_dense_run_by_one_command_and_continues_at_its_step(tmp_path):
    block = code_blocks(README, "bash")[3]
    dense_command, upcycle_command = (
        shlex.split(c) for c in block.replace("\\\n", " ").splitlines() if c.strip()
    )
    dense_dir, sparse_dir = tmp_path / "dense", tmp_path / "upcycled"
    paths = {"/tmp/dense_tiny": str(dense_dir), "/tmp/upcycled_tiny": str(sparse_dir)}

    def local(args):
        out = []
        for arg in args[1:]:
            for old, new in paths.items():
                arg = arg.replace(old, new)
            out.append(arg)
        return out

    assert dense_command[0] == upcycle_command[0] == "keras-moe-train"
    dense = _run(local(dense_command) + _flags(SMALL + ["TRAIN_STEPS = 2"]))
    assert dense.returncode == 0, dense.stdout[-2000:] + dense.stderr[-3000:]
    upcycled = run_cli_here(
        local(upcycle_command) + _flags(SMALL + ["TopKFeedForward.d_ff = 64", "TRAIN_STEPS = 4"])
    )
    assert upcycled.returncode == 0, upcycled.stdout[-2000:] + upcycled.stderr[-3000:]
    assert "upcycled checkpoint" in upcycled.stdout and "continuing at step 2" in upcycled.stdout
    # The start matches, as README section 5 says, and the run shows it.
    assert "upcycled start: the first batch's logits are the dense model's" in upcycled.stdout
    with open(os.path.join(sparse_dir, "summary.json")) as f:
        summary = json.load(f)
    assert (summary["start_step"], summary["end_step"]) == (2, 4), summary
    with open(os.path.join(sparse_dir, "operative_config.gin")) as f:
        assert "TopKFeedForward.num_experts = 8" in f.read()

    # Run again with a longer run: it resumes from its own step-4 checkpoint, as any run does.
    resumed = run_cli_here(
        local(upcycle_command) + _flags(SMALL + ["TopKFeedForward.d_ff = 64", "TRAIN_STEPS = 6"])
    )
    assert resumed.returncode == 0, resumed.stdout[-2000:] + resumed.stderr[-3000:]
    assert "resumed from checkpoint" in resumed.stdout
    assert "upcycled checkpoint" not in resumed.stdout
    with open(os.path.join(sparse_dir, "summary.json")) as f:
        summary = json.load(f)
    assert (summary["start_step"], summary["end_step"]) == (4, 6), summary


def test_upcycle_gin_without_init_checkpoint_is_refused_naming_it():
    import keras_moe.training.train_configurables  # noqa: F401  (registers train)
    from keras_moe.gin_config import GinConfigError, parse_gin

    with pytest.raises(GinConfigError, match=r"require a value for \['INIT_CHECKPOINT'\]"):
        parse_gin(["upcycle.gin"], [])
