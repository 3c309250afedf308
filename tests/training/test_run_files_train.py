"""Every shipped run file (gin/runs/) trains a few steps, not only parses.

Each file trains as written, made small by bindings of the model's sizes and the
run's length (and, where its data cannot be had offline, the embedded corpus in
place of C4): here, in this process, or in a JAX process of 8 emulated devices
for the mesh file. The others are trained by the tests named in ELSEWHERE.
"""

import json
import os
import pathlib

import pytest

from tests.training.helpers import REPO, cli_bindings, run_cli, run_cli_here
from tests.training.tiny_run import GROUP, tiny_run

RUNS = pathlib.Path(REPO) / "gin" / "runs"

SMALL = [
    "T5Config.d_model = 32",
    "T5Config.num_heads = 2",
    "T5Config.d_kv = 16",
    "T5Config.d_ff = 64",
    "T5Config.num_encoder_layers = 2",
    "T5Config.num_decoder_layers = 2",
    'TASK_FEATURE_LENGTHS = {"inputs": 64, "targets": 16}',
    "BATCH_SIZE = 8",
    "TRAIN_STEPS = 3",
    "CheckpointConfig.every = 3",
    "CheckpointConfig.backup_every = None",
    "train.log_every = 1",
    "train.summary_batches = 0",
    "train.expert_load_every = 0",
    "train.steps_per_execution = 1",
    "train.validation_freq = 0",
]
# C4 comes from a TFDS download: the same job on the embedded corpus, on this host's CPU.
OFFLINE_C4 = ['MIXTURE_OR_TASK_NAME = "embedded_span_corruption"', "SwitchFeedForward.d_ff = 64"]

# Trained here, each as a standalone job.
STANDALONE = {
    "tiny_local_fine_grained": (["tiny_local_fine_grained.gin"], []),
    "pretrain_docs_short": (["pretrain_docs_short.gin"], ["SwitchFeedForward.d_ff = 64"]),
    "translate_bible_x2en": (["translate_bible_x2en.gin"], ["SwitchFeedForward.d_ff = 64"]),
    "pretrain_c4": (
        ["pretrain_c4.gin"],
        OFFLINE_C4
        + ['StrategyPlacement.strategy = "default"', "StrategyPlacement.tpu_name = None"],
    ),
}
MESH = {"pretrain_c4_mesh": (["pretrain_c4_mesh.gin"], OFFLINE_C4)}
# Trained by other tests (a test module or helper that runs them as users type them).
ELSEWHERE = {
    "tiny_local": "tests/training/tiny_run.py",  # README command 1
    "finetune": "tests/training/test_run_files_train.py",  # from tiny_run, below
    "tiny_local_job": "tests/training/test_upcycle_cli.py",  # README section 5, dense run
    "upcycle": "tests/training/test_upcycle_cli.py",  # README section 5, upcycled run
    "distill": "tests/distill/test_cli.py",
}
# pretrain_docs.gin with these bindings is pretrain_docs_short.gin (tests/training/
# test_docs_run.py: the same job but for its length, which SMALL sets); defaults.gin
# is included by every run file.
SAME_AS_TRAINED = {"pretrain_docs", "defaults"}


def _flags(files, bindings):
    return [f"--gin_file={f}" for f in files] + [
        f"--gin_bindings={b}" for b in SMALL + list(bindings)
    ]


def _trained(model_dir, result):
    console = result.stdout[-3000:] + result.stderr[-3000:]
    assert result.returncode == 0, console
    summary = json.loads((model_dir / "summary.json").read_text())
    assert summary["end_step"] - summary["start_step"] >= 2, summary
    losses = [loss for _, loss in summary["history"]]
    assert all(loss == loss and loss < 1e4 for loss in losses), (losses, console)
    return summary


def test_every_run_file_is_trained_by_a_test():
    shipped = {p.stem for p in RUNS.glob("*.gin")}
    assert shipped == set(STANDALONE) | set(MESH) | set(ELSEWHERE) | SAME_AS_TRAINED
    for name, test_file in ELSEWHERE.items():
        assert os.path.isfile(os.path.join(REPO, test_file)), (name, test_file)


@pytest.mark.e2e
@pytest.mark.parametrize("name", sorted(STANDALONE))
def test_a_standalone_run_file_trains(tmp_path, name):
    files, bindings = STANDALONE[name]
    model_dir = tmp_path / name
    _trained(model_dir, run_cli_here(_flags(files, bindings) + [f"--model_dir={model_dir}"]))


@pytest.mark.xdist_group(GROUP)
def test_finetune_gin_header_example_trains_from_the_tiny_run(tmp_path_factory, tmp_path):
    """finetune.gin's own example (Adafactor, dropout 0.1, expert dropout 0.4, from the
    README's tiny run) trains past its first steps: Keras' Adafactor turned a zero
    gradient row into NaN at step 1 and failed at step 2."""
    source_dir, _ = tiny_run(tmp_path_factory)
    model_dir = tmp_path / "finetuned"
    result = run_cli_here(
        ["--gin_file=finetune.gin", f"--model_dir={model_dir}"]
        + cli_bindings(
            [
                f'INIT_CHECKPOINT = "{source_dir}"',
                "TRAIN_STEPS = 8",
                "CheckpointConfig.every = 4",
                "train.summary_batches = 1",
            ]
        )
    )
    _trained(model_dir, result)


@pytest.mark.slow
@pytest.mark.jax
def test_the_mesh_run_file_trains_on_eight_emulated_devices(tmp_path):
    ((files, bindings),) = MESH.values()
    model_dir = tmp_path / "mesh"
    env = {
        "KERAS_BACKEND": "jax",
        "JAX_PLATFORMS": "cpu",
        "XLA_FLAGS": "--xla_force_host_platform_device_count=8 "
        "--xla_cpu_collective_call_terminate_timeout_seconds=400",
    }
    result = run_cli(_flags(files, bindings) + [f"--model_dir={model_dir}"], timeout=600, env=env)
    summary = _trained(model_dir, result)
    assert summary["mesh"] == {"data": 1, "expert": 8, "model": 1}, summary
    assert os.path.isfile(model_dir / "checkpoints" / "ckpt-00000003.weights.h5")
