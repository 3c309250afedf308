"""The gin job on a JAX device mesh (a MeshPlacement), and the clear refusals elsewhere."""

import json
import os
import shlex
import socket
import subprocess
import sys

import pytest

from tests.training.helpers import REPO, run_cli


def _doc_command():
    """docs/sharding.md's keras-moe-train command: (environment, arguments)."""
    from tests.docs.test_readme_snippets import SHARDING, code_blocks

    block = code_blocks(SHARDING, "bash")[0]
    command = shlex.split(block.replace("\\\n", " ").splitlines()[0])
    start = command.index("keras-moe-train")
    env = dict(a.split("=", 1) for a in command[:start])  # the VAR=value prefix
    # As in tests/sharding/conftest.py: 8 emulated devices on 2 shared cores can take longer
    # than XLA's default 40 s to all reach a collective while the other test worker runs.
    env["XLA_FLAGS"] += " --xla_cpu_collective_call_terminate_timeout_seconds=400"
    env["JAX_PLATFORMS"] = "cpu"
    return env, command[start + 1 :], block


def _with_model_dir(args, model_dir):
    return [a if not a.startswith("--model_dir=") else f"--model_dir={model_dir}" for a in args]


# Short runs of the doc command; the input is read as 2 seqio shards, so a run with 2
# processes (one shard each) sees the same global batches as one process reading both.
SHORT = [
    "TRAIN_STEPS = 4",
    "CheckpointConfig.every = 2",
    "train.summary_batches = 0",
    "DatasetConfig.input_shards = 2",
]


@pytest.fixture(scope="module")
def one_process_run(tmp_path_factory):
    env, args, block = _doc_command()
    model_dir = tmp_path_factory.mktemp("mesh") / "run"
    result = run_cli(
        _with_model_dir(args, model_dir) + [f"--gin_bindings={b}" for b in SHORT],
        timeout=600,
        env=env,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return block, result, model_dir


def _losses(model_dir):
    summary = json.loads((model_dir / "summary.json").read_text())
    return summary, dict(summary["history"])


@pytest.mark.slow
@pytest.mark.jax
@pytest.mark.xdist_group("mesh")
def test_the_sharding_doc_command_shards_the_experts_over_eight_devices(one_process_run):
    """docs/sharding.md's command, shortened to 4 steps, prints what the doc shows."""
    block, result, model_dir = one_process_run
    shown_lines = [line.lstrip("# ").rstrip() for line in block.splitlines() if line[:1] == "#"]
    for shown in shown_lines:
        assert shown in result.stdout, (shown, result.stdout[-3000:])
    # The dense weights are not split.
    assert "attention/query ('embed', 'heads'): (64, 64) -> (64, 64) on one device" in result.stdout
    summary, _ = _losses(model_dir)
    assert summary["end_step"] == 4 and summary["mesh"] == {"data": 2, "expert": 4, "model": 1}
    assert os.path.isfile(model_dir / "checkpoints" / "ckpt-00000004.weights.h5")


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
@pytest.mark.jax
@pytest.mark.xdist_group("mesh")
def test_two_processes_train_like_one_and_resume_on_another_mesh(one_process_run, tmp_path):
    """2 processes x 4 CPU devices on loopback == 1 process x 8 devices, step by step;
    their sharded checkpoint then resumes in one process on a {"data": 4, "expert": 2} mesh."""
    _, _, reference_dir = one_process_run
    env, args, _ = _doc_command()
    env["XLA_FLAGS"] = env["XLA_FLAGS"].replace("device_count=8", "device_count=4")
    model_dir = tmp_path / "run"
    address = f"127.0.0.1:{_free_port()}"
    command = (
        [sys.executable, "-m", "keras_moe.training"]
        + _with_model_dir(args, model_dir)
        + [f"--gin_bindings={b}" for b in SHORT]
        + [f"--coordinator_address={address}", "--process_count=2"]
    )
    full_env = {**os.environ, **env, "PYTHONPATH": REPO, "TF_CPP_MIN_LOG_LEVEL": "3"}
    processes = [
        subprocess.Popen(
            command + [f"--process_index={i}"],
            cwd=REPO,
            env=full_env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for i in range(2)
    ]
    try:
        outputs = [p.communicate(timeout=600)[0] for p in processes]
    finally:  # a hung or failed process must not outlive the test (its peer waits for it)
        for p in processes:
            if p.poll() is None:
                p.kill()
    for p, out in zip(processes, outputs, strict=False):
        assert p.returncode == 0, out[-4000:]
    assert "process 1 of 2: input shards [1] of 2, 8 rows each" in outputs[1]
    # Process 0 alone reports steps and commits checkpoints.
    for line in ("[keras_moe] step 4/4", "saved checkpoint"):
        assert line in outputs[0] and line not in outputs[1], line

    reference, reference_losses = _losses(reference_dir)
    summary, losses = _losses(model_dir)
    assert summary["processes"] == 2 and summary["end_step"] == 4
    assert sorted(losses) == sorted(reference_losses) == [1, 2, 3, 4]
    for step in losses:
        assert losses[step] == pytest.approx(reference_losses[step], rel=2e-5), step
    # Sharded checkpoints, committed once (by process 0).
    checkpoints = sorted(os.listdir(model_dir / "checkpoints"))
    assert "ckpt-00000004.orbax" in checkpoints and "ckpt-00000004.json" in checkpoints
    assert not any(name.endswith(".weights.h5") for name in checkpoints)

    # Resume from step 2 (as if the job died after it) in one process on another mesh:
    # the weights are resharded and the data continues where it was.
    os.remove(model_dir / "checkpoints" / "ckpt-00000004.json")
    env = _doc_command()[0]
    resumed = run_cli(
        _with_model_dir(args, model_dir)
        + [f"--gin_bindings={b}" for b in SHORT + ['train.mesh_shape = {"data": 4, "expert": 2}']],
        timeout=600,
        env=env,
    )
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    assert "resumed from checkpoint" in resumed.stdout and "ckpt-00000002.orbax" in resumed.stdout
    summary, losses = _losses(model_dir)
    assert summary["start_step"] == 2 and sorted(losses) == [3, 4]
    for step in (3, 4):
        assert losses[step] == pytest.approx(reference_losses[step], rel=2e-5), step


@pytest.mark.jax
def test_a_batch_that_does_not_split_over_the_mesh_is_refused_at_start_up(tmp_path):
    """The doc command with BATCH_SIZE = 15 on data 2 x expert 4: refused, naming the
    batch size, the mesh and the sizes that divide, before the model dir is written."""
    env, args, _ = _doc_command()
    model_dir = tmp_path / "run"
    result = run_cli(
        _with_model_dir(args, model_dir) + ["--gin_bindings=BATCH_SIZE = 15"], timeout=300, env=env
    )
    assert result.returncode == 2, result.stdout[-3000:] + result.stderr[-3000:]
    assert (
        "keras-moe-train: error: BATCH_SIZE=15 does not split over the device mesh "
        "{'data': 2, 'expert': 4}: the batch is split over the mesh axes ('data', 'expert') "
        "= 8 devices, so BATCH_SIZE must be a multiple of 8 (e.g. 8 or 16)."
    ) in result.stderr
    assert "Traceback" not in result.stderr
    assert not os.path.exists(model_dir / "checkpoints")


@pytest.mark.e2e
@pytest.mark.parametrize(
    "bindings,message",
    [
        (['train.mesh_shape = {"data": 2}'], "needs KERAS_BACKEND=jax.*StrategyPlacement.strategy"),
        (
            ["train.logical_axis_rules = [('batch', 'data')]"],
            "train.logical_axis_rules is set but train.mesh_shape",
        ),
    ],
)
def test_mesh_settings_are_refused_where_they_cannot_apply(tmp_path, bindings, message):
    from keras_moe.training.errors import TrainingConfigError
    from tests.reliability import helpers

    with pytest.raises(TrainingConfigError, match=message):
        helpers.train_in_process(tmp_path / "run", bindings)
    assert not os.path.exists(tmp_path / "run") or os.listdir(tmp_path / "run") == []


@pytest.mark.parametrize(
    "mesh_shape,message",
    [
        ({"data": 2, "expert": 2}, "4 devices but 8 devices are available"),
        # More devices than this CPU host has: the error says how to emulate them.
        (
            {"data": 4, "expert": 4},
            "16 devices but 8 devices are available.*On a CPU host, emulate "
            "16 devices: start the command with XLA_FLAGS=--xla_force_host_"
            "platform_device_count=16 PJRT_NPROC=32",
        ),
        ({"data": 2, "experts": 4}, "Unknown mesh axis 'experts'"),
    ],
)
def test_a_bad_mesh_is_refused_before_the_model_dir_is_written(monkeypatch, mesh_shape, message):
    """On JAX (faked here: the check itself needs no devices), the mesh is validated
    with the arguments, not only when the model is built."""
    import keras

    from keras_moe.training.errors import TrainingConfigError
    from keras_moe.training.placement import mesh

    monkeypatch.setattr(keras.backend, "backend", lambda: "jax")
    monkeypatch.setattr(keras.distribution, "list_devices", lambda: [f"cpu:{i}" for i in range(8)])
    with pytest.raises(TrainingConfigError, match=message):
        mesh.check_mesh(mesh_shape, None, "default")
    mesh.check_mesh({"data": 2, "expert": 4}, None, "default")  # the right size passes


@pytest.mark.parametrize(
    "kwargs,message",
    [
        (dict(process_count=2, process_index=0), "need --coordinator_address"),
        (
            dict(coordinator_address="h:1", process_count=2, process_index=0, backend="tensorflow"),
            'StrategyPlacement.strategy = "multi_worker"',
        ),
        (
            dict(coordinator_address="host0", process_count=2, process_index=0, backend="jax"),
            "must be HOST:PORT or 'auto'",
        ),
        (
            dict(coordinator_address="h:1", process_count=None, process_index=0, backend="jax"),
            "--process_count must be an integer >= 1",
        ),
        (
            dict(coordinator_address="h:1", process_count=2, process_index=2, backend="jax"),
            r"--process_index must be an integer in \[0, 2\)",
        ),
    ],
)
def test_bad_process_flags_are_refused_before_jax_starts(kwargs, message):
    from keras_moe.training.errors import TrainingConfigError
    from keras_moe.training.placement import multihost

    with pytest.raises(TrainingConfigError, match=message):
        multihost.initialize(**kwargs)


@pytest.mark.parametrize(
    "args,expected",
    [
        ((16, None, 0, 1), ([0], 1, 16)),  # one process: the task unsharded
        ((16, 2, 0, 1), ([0, 1], 2, 8)),  # one process reading 2 shards
        ((16, 4, 1, 2), ([2, 3], 4, 4)),  # process 1 of 2: the second half of 4 shards
        ((16, None, 3, 4), ([3], 4, 4)),
    ],
)
def test_input_plan_gives_each_process_its_block_of_the_global_batch(args, expected):
    from keras_moe.training.placement import multihost

    assert multihost.input_plan(*args) == expected


@pytest.mark.parametrize(
    "args,message",
    [
        ((16, 3, 0, 2), "positive multiple of the 2 process"),
        ((10, 4, 0, 1), "BATCH_SIZE=10 must divide into DatasetConfig.input_shards=4"),
        ((16, 0, 0, 1), "positive multiple"),
    ],
)
def test_input_plan_refuses_shards_that_do_not_split_evenly(args, message):
    from keras_moe.training.errors import TrainingConfigError
    from keras_moe.training.placement import multihost

    with pytest.raises(TrainingConfigError, match=message):
        multihost.input_plan(*args)
