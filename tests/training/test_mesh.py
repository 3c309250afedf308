"""The gin job on a JAX device mesh (MESH_SHAPE), and the clear refusals elsewhere."""

import json
import os
import shlex

import pytest

from tests.training.helpers import run_cli


@pytest.mark.slow
@pytest.mark.jax
def test_the_sharding_doc_command_shards_the_experts_over_eight_devices(tmp_path):
    """docs/sharding.md's command, shortened to 4 steps, prints what the doc shows."""
    from tests.docs.test_readme_snippets import SHARDING, code_blocks

    block = code_blocks(SHARDING, "bash")[0]
    command = shlex.split(block.replace("\\\n", " ").splitlines()[0])
    start = command.index("keras-moe-train")
    env = dict(a.split("=", 1) for a in command[:start])  # the VAR=value prefix
    # As in tests/sharding/conftest.py: 8 emulated devices on 2 shared cores can take longer
    # than XLA's default 40 s to all reach a collective while the other test worker runs.
    env["XLA_FLAGS"] += " --xla_cpu_collective_call_terminate_timeout_seconds=400"
    args = command[start + 1:]
    model_dir = tmp_path / "run"
    args = [a if not a.startswith("--model_dir=") else f"--model_dir={model_dir}" for a in args]
    result = run_cli(args + [f"--gin_bindings={b}" for b in (
        "TRAIN_STEPS = 4", "CHECKPOINT_EVERY = 2", "SUMMARY_BATCHES = 1")],
        timeout=600, env={**env, "JAX_PLATFORMS": "cpu"})
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    shown_lines = [line.lstrip("# ").rstrip() for line in block.splitlines() if line[:1] == "#"]
    for shown in shown_lines:
        assert shown in result.stdout, (shown, result.stdout[-3000:])
    # The dense weights are not split.
    assert "attention/query ('embed', 'heads'): (64, 64) -> (64, 64) on one device" in result.stdout
    summary = json.loads((model_dir / "summary.json").read_text())
    assert summary["end_step"] == 4 and summary["mesh"] == {"data": 2, "expert": 4, "model": 1}
    assert os.path.isfile(model_dir / "checkpoints" / "ckpt-00000004.weights.h5")


@pytest.mark.parametrize("bindings,message", [
    (['MESH_SHAPE = {"data": 2}'], "needs KERAS_BACKEND=jax.*STRATEGY"),
    (["LOGICAL_AXIS_RULES = [('batch', 'data')]"], "LOGICAL_AXIS_RULES is set but MESH_SHAPE"),
])
def test_mesh_settings_are_refused_where_they_cannot_apply(tmp_path, bindings, message):
    from keras_moe.training.errors import TrainingConfigError
    from tests.reliability import helpers

    with pytest.raises(TrainingConfigError, match=message):
        helpers.train_in_process(tmp_path / "run", bindings)
    assert not os.path.exists(tmp_path / "run") or os.listdir(tmp_path / "run") == []


@pytest.mark.parametrize("mesh_shape,message", [
    ({"data": 2, "expert": 2}, "4 devices but 8 devices are available"),
    ({"data": 2, "experts": 4}, "Unknown mesh axis 'experts'"),
])
def test_a_bad_mesh_is_refused_before_the_model_dir_is_written(monkeypatch, mesh_shape,
                                                              message):
    """On JAX (faked here: the check itself needs no devices), the mesh is validated
    with the arguments, not only when the model is built."""
    import keras

    from keras_moe.training import mesh
    from keras_moe.training.errors import TrainingConfigError

    monkeypatch.setattr(keras.backend, "backend", lambda: "jax")
    monkeypatch.setattr(keras.distribution, "list_devices", lambda: [f"cpu:{i}" for i in range(8)])
    with pytest.raises(TrainingConfigError, match=message):
        mesh.check_mesh(mesh_shape, None, "default")
    mesh.check_mesh({"data": 2, "expert": 4}, None, "default")  # the right size passes
