"""The Cloud TPU scripts in --dry-run print the exact gcloud commands; bad arguments fail."""

import os
import shlex
import subprocess

import pytest

from tests.training.helpers import REPO

# Each test here starts a process.
pytestmark = pytest.mark.e2e


def _run(script, *args):
    return subprocess.run(
        ["bash", os.path.join(REPO, "tpu_scripts", script), *args],
        capture_output=True,
        text=True,
        timeout=30,
    )


def _argv(result):
    assert result.returncode == 0, result.stderr
    lines = [line for line in result.stdout.splitlines() if line.strip()]
    assert len(lines) == 1
    return shlex.split(lines[0])


def test_create_v4_and_v5e():
    argv = _argv(
        _run(
            "create.sh",
            "--name=moe",
            "--zone=us-central2-b",
            "--type=v4-8",
            "--project=p1",
            "--dry-run",
        )
    )
    assert argv == [
        "gcloud",
        "compute",
        "tpus",
        "tpu-vm",
        "create",
        "moe",
        "--zone=us-central2-b",
        "--accelerator-type=v4-8",
        "--version=tpu-ubuntu2204-base",
        "--project=p1",
    ]
    argv = _argv(
        _run(
            "create.sh",
            "--name=moe5",
            "--zone=us-west4-a",
            "--type=v5litepod-16",
            "--spot",
            "--dry-run",
        )
    )
    assert "--accelerator-type=v5litepod-16" in argv and "--spot" in argv
    assert "--version=v2-alpha-tpuv5-lite" in argv


def _lines(result):
    assert result.returncode == 0, result.stderr
    return [shlex.split(line) for line in result.stdout.splitlines() if line.strip()]


def test_setup_installs_this_checkout_a_repository_or_a_wheel_never_a_package_name():
    archive, scp, ssh = _lines(_run("setup.sh", "--name=moe", "--zone=z1", "--dry-run"))
    assert archive[:4] == ["git", "-C", REPO, "archive"] and archive[-1] == "HEAD"
    assert scp[:5] == ["gcloud", "compute", "tpus", "tpu-vm", "scp"]
    assert scp[5] == archive[archive.index("-o") + 1] and "--worker=all" in scp
    assert ssh[:7] == ["gcloud", "compute", "tpus", "tpu-vm", "ssh", "moe", "--zone=z1"]
    assert "--worker=all" in ssh
    command = ssh[-1][len("--command=") :]
    install = "tar -xzf ~/keras_moe-src.tar.gz -C ~ && (cd ~/keras_moe && bash scripts/install.sh)"
    # The TPU build of TensorFlow goes in after keras_moe's own tensorflow requirement.
    assert 0 <= command.find(install) < command.find("pip install 'tensorflow-tpu==2.21.*'")
    (ssh,) = _lines(
        _run(
            "setup.sh",
            "--name=moe",
            "--zone=z1",
            "--dry-run",
            "--repo=https://example.org/keras_moe.git",
            "--ref=v1",
        )
    )
    clone = "git clone --depth 1 --branch v1 https://example.org/keras_moe.git ~/keras_moe"
    assert clone in ssh[-1]
    scp, ssh = _lines(
        _run(
            "setup.sh",
            "--name=moe",
            "--zone=z1",
            "--dry-run",
            "--wheel=dist/keras_moe-0.1.0-py3-none-any.whl",
        )
    )
    assert scp[5:7] == [
        "dist/keras_moe-0.1.0-py3-none-any.whl",
        "moe:keras_moe-0.1.0-py3-none-any.whl",
    ]
    assert "pip install ~/keras_moe-0.1.0-py3-none-any.whl" in ssh[-1]
    # --backend=jax: JAX's TPU runtime of the installed jax's version, not TensorFlow's.
    *_, ssh = _lines(_run("setup.sh", "--name=moe", "--zone=z1", "--backend=jax", "--dry-run"))
    command = ssh[-1]
    assert (
        0
        <= command.find(install)
        < command.find(
            "pip install \"jax[tpu]==$(python3 -c 'import jax; print(jax.__version__)')\""
        )
    )
    assert "tensorflow-tpu" not in command
    for lines in (
        _lines(_run("setup.sh", "--name=moe", "--zone=z1", "--dry-run", *args))
        for args in ([], ["--repo=https://example.org/k.git"], ["--wheel=k.whl"])
    ):
        assert not any(
            "pip install 'keras_moe'" in " ".join(words) or "install keras_moe" in " ".join(words)
            for words in lines
        )


def test_setup_launch_logs_delete():
    argv = _argv(
        _run(
            "launch.sh",
            "--name=moe",
            "--zone=z1",
            "--gin_file=pretrain_c4.gin",
            "--model_dir=/mnt/runs/c4",
            "--gin_bindings=SwitchFeedForward.num_experts = 16",
            "--dry-run",
        )
    )
    assert "--worker=all" in argv
    command = argv[-1][len("--command=") :]
    inner = shlex.split(command)
    assert inner[:3] == ["nohup", "JAX_PLATFORMS=cpu", "keras-moe-train"]
    assert "--gin_file=pretrain_c4.gin" in inner and "--model_dir=/mnt/runs/c4" in inner
    assert {
        "--gin_bindings=train.placement = @StrategyPlacement()",
        '--gin_bindings=StrategyPlacement.strategy = "tpu"',
    } <= set(inner)
    assert "--gin_bindings=SwitchFeedForward.num_experts = 16" in inner
    # The JAX path: one process per worker, joined by jax.distributed; no tf.distribute.
    argv = _argv(
        _run(
            "launch.sh",
            "--name=moe",
            "--zone=z1",
            "--gin_file=pretrain_c4_mesh.gin",
            "--model_dir=/mnt/runs/c4",
            "--backend=jax",
            "--dry-run",
        )
    )
    assert "--worker=all" in argv
    inner = shlex.split(argv[-1][len("--command=") :])
    assert inner[:3] == ["nohup", "KERAS_BACKEND=jax", "keras-moe-train"]
    assert "--coordinator_address=auto" in inner and "--gin_file=pretrain_c4_mesh.gin" in inner
    assert not any("StrategyPlacement" in a or "JAX_PLATFORMS" in a for a in inner)
    argv = _argv(_run("logs.sh", "--name=moe", "--zone=z1", "--worker=1", "--dry-run"))
    assert "--worker=1" in argv and argv[-1].startswith("--command=tail")
    argv = _argv(_run("delete.sh", "--name=moe", "--zone=z1", "--dry-run"))
    assert argv == ["gcloud", "compute", "tpus", "tpu-vm", "delete", "moe", "--zone=z1", "--quiet"]


@pytest.mark.parametrize(
    "script,args,message",
    [
        ("create.sh", ["--name=moe", "--zone=z", "--type=v3-8"], "--type"),
        ("create.sh", ["--name=Bad_Name", "--zone=z", "--type=v4-8"], "not a valid TPU name"),
        ("create.sh", ["--name=moe", "--type=v4-8"], "--zone is required"),
        ("launch.sh", ["--name=moe", "--zone=z", "--gin_file=x.gin"], "--model_dir is required"),
        ("logs.sh", ["--name=moe", "--zone=z", "--worker=a"], "--worker"),
        ("delete.sh", ["--name=moe", "--zone=z", "--force"], "unknown argument"),
        ("setup.sh", ["--name=moe", "--zone=z", "--package=keras_moe"], "not on the package index"),
        ("setup.sh", ["--name=moe", "--zone=z", "--wheel=k.tar.gz"], "not a .whl"),
        ("setup.sh", ["--name=moe", "--zone=z", "--ref=v1"], "--ref needs --repo"),
        (
            "launch.sh",
            ["--name=moe", "--zone=z", "--gin_file=x.gin", "--model_dir=gs://b/r"],
            "gcsfuse",
        ),
        (
            "launch.sh",
            ["--name=moe", "--zone=z", "--gin_file=x.gin", "--model_dir=/m", "--backend=torch"],
            "--backend must be tensorflow or jax",
        ),
        ("setup.sh", ["--name=moe", "--zone=z", "--backend=torch"], "--backend must be"),
    ],
)
def test_bad_arguments_fail_with_a_message(script, args, message):
    result = _run(script, *args, "--dry-run")
    assert result.returncode == 2 and message in result.stderr
    assert "gcloud" not in result.stdout
