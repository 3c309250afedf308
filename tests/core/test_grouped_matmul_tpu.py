"""The TPU path of `grouped_matmul` (the megablox Pallas kernel) and dropless on TPU.

The kernel runs in the Pallas interpreter on this CPU (small shapes) against a
float64 NumPy reference, forward and gradients; the TPU compiler (libtpu)
compiles a dropless Switch layer and the tiny Switch model for v5e:2x2. The
backend is fixed per process, so the checks run in subprocesses (this file,
run as a script, with the check's name) on the JAX backend.
"""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TPU_ENV = {
    "TPU_SKIP_MDS_QUERY": "1",
    "TPU_WORKER_HOSTNAMES": "localhost",
    # Other processes may hold libtpu's lockfile; nothing here runs on a TPU.
    "ALLOW_MULTIPLE_LIBTPU_LOAD": "1",
}


def _run(check, timeout=240, env=None):
    full = dict(
        os.environ,
        KERAS_BACKEND="jax",
        JAX_PLATFORMS="cpu",
        TF_CPP_MIN_LOG_LEVEL="3",
        PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""),
    )
    full.update(env or {})
    done = subprocess.run(
        [sys.executable, os.path.abspath(__file__), check],
        env=full,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    return done.stdout


def reference(x, w, sizes, upstream):
    """float64 y = grouped x @ w and the gradients of sum(y * upstream) w.r.t. x and w."""
    x, w, upstream = (np.asarray(a, np.float64) for a in (x, w, upstream))
    y, dx, dw = np.zeros((x.shape[0], w.shape[-1])), np.zeros_like(x), np.zeros_like(w)
    start = 0
    for e, size in enumerate(sizes):
        rows = slice(start, start + int(size))
        y[rows] = x[rows] @ w[e]
        dx[rows] = upstream[rows] @ w[e].T
        dw[e] = x[rows].T @ upstream[rows]
        start += int(size)
    return y, dx, dw


# Rows 70 (not a tile multiple), empty groups (first, middle, last), 14 rows
# past sum(group_sizes); k = 40 and n = 136 are not multiples of 128.
CASE = dict(rows=70, k=40, n=136, sizes=[0, 20, 1, 0, 30, 5, 0])


def _case(dtype, seed=0):
    rng = np.random.default_rng(seed)
    sizes = np.array(CASE["sizes"], "int64")  # the kernel's int32 is the function's job
    x = rng.normal(size=(CASE["rows"], CASE["k"])).astype("float32")
    w = rng.normal(size=(len(sizes), CASE["k"], CASE["n"])).astype("float32")
    upstream = rng.normal(size=(CASE["rows"], CASE["n"])).astype("float32")
    if dtype == "bfloat16":  # the reference sees the values the kernel sees
        import ml_dtypes

        x, w = x.astype(ml_dtypes.bfloat16), w.astype(ml_dtypes.bfloat16)
    return x, w, sizes, upstream


def check_interpret():
    """megablox (interpreted) vs the float64 reference, float32 and bfloat16."""
    import jax
    import jax.numpy as jnp

    from keras_moe.dispatch.grouped_matmul import grouped_matmul

    for dtype, tol in (("float32", 1e-4), ("bfloat16", 3e-2)):
        x, w, sizes, upstream = _case(dtype)

        def loss(x, w):
            y = grouped_matmul(x, w, sizes, kernel="megablox", interpret=True)  # noqa: B023 - called in this iteration
            return jnp.sum(y.astype(jnp.float32) * upstream), y  # noqa: B023 - called in this iteration

        (_, y), (dx, dw) = jax.value_and_grad(loss, argnums=(0, 1), has_aux=True)(
            jnp.asarray(x), jnp.asarray(w)
        )
        assert y.dtype == dtype and dx.dtype == dtype and dw.dtype == dtype
        for got, want in zip((y, dx, dw), reference(x, w, sizes, upstream), strict=False):
            got = np.asarray(got, np.float64)
            scale = max(1.0, float(np.abs(want).max()))
            assert np.abs(got - want).max() <= tol * scale, (dtype, np.abs(got - want).max())
        # Rows past the groups give exactly 0, and so does their gradient.
        past = int(sizes.sum())
        assert not np.asarray(y[past:], np.float64).any()
        assert not np.asarray(dx[past:], np.float64).any()
        print("OK interpret", dtype)


def check_interpret_mesh():
    """Under a 4-device mesh the rows are split over the devices: same numbers."""
    import jax
    import jax.numpy as jnp

    jax.config.update("jax_num_cpu_devices", 4)
    from keras_moe.dispatch.grouped_matmul import grouped_matmul
    from keras_moe.parallel import sharding

    x, w, sizes, upstream = _case("float32", seed=1)
    # The weights enter the kernel whole on every device (gathered when their
    # 8 groups are split over the 2 expert shards).
    cases = {
        "7_groups": (x, w, sizes),
        "8_groups": (x, np.concatenate([w, w[:1] * 0.5]), np.concatenate([sizes, [9]])),
    }
    for name, (x, w, sizes) in cases.items():
        sharding.configure_mesh(
            {"data": 2, "expert": 2, "model": 1}, devices=jax.devices()[:4], num_experts=8
        )
        try:

            def loss(x, w):
                y = grouped_matmul(x, w, sizes, kernel="megablox", interpret=True)  # noqa: B023 - called in this iteration
                return jnp.sum(y * upstream), y

            (_, y), (dx, dw) = jax.jit(jax.value_and_grad(loss, argnums=(0, 1), has_aux=True))(
                jnp.asarray(x), jnp.asarray(w)
            )
        finally:
            sharding.clear_mesh()
        for got, want in zip((y, dx, dw), reference(x, w, sizes, upstream), strict=False):
            error = np.abs(np.asarray(got, np.float64) - want).max()
            assert error <= 1e-4 * np.abs(want).max(), (name, error)
        print("OK interpret_mesh", name)


def check_tpu_layer():
    """A dropless Switch layer compiled for v5e:2x2: the megablox kernel, FLOPs of a dense FFN."""
    from benchmarks import dropless_tpu

    tokens, d_model, d_ff, chips = 4 * 2048, 256, 512, 4
    run = dropless_tpu.compile_layer(
        "dropless",
        "v5e:2x2",
        {"data": 4, "expert": 1, "model": 1},
        batch=4,
        length=2048,
        d_model=d_model,
        d_ff=d_ff,
        num_experts=8,
    )
    print(json.dumps(run))
    # Forward (gmm), and backward: gmm for the rows' gradient, tgmm for the
    # weights', for each of the two expert matmuls.
    assert run["megablox_calls"] >= 6, run
    # Hand count: two matmuls of 2 * T * d_model * d_ff, forward and twice
    # backward, T / chips tokens per chip: what a dense FFN of d_ff costs.
    dense = 3 * 2 * 2 * tokens * d_model * d_ff / chips
    assert dense <= run["flops_per_chip"] <= 1.1 * dense, run["flops_per_chip"] / dense
    print("OK tpu_layer")


def check_tiny_model_cli():
    """The tiny Switch model's train step with dispatch='dropless' compiles for v5e:2x2."""
    bindings = [
        'SwitchFeedForward.group_size = "sequence"',
        "BATCH_SIZE = 8",
        'TASK_FEATURE_LENGTHS = {"inputs": 32, "targets": 8}',
        'train.mesh_shape = {"data": 4, "expert": 1, "model": 1}',
        'SwitchFeedForward.dispatch = "dropless"',
    ]
    args = [
        "--gin_file=tiny_local.gin",
        "--gin_file=switch_tiny.gin",
        *[f"--gin_bindings={b}" for b in bindings],
        "--topology=v5e:2x2",
        "--json",
    ]
    done = subprocess.run(
        [sys.executable, "-m", "keras_moe.tpu_compile.compile_cli", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=200,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout[done.stdout.index("{") :])
    assert report["dispatch"] == "dropless" and report["fits"] is True, report
    assert report["flops_per_chip"] > 0
    print("OK tiny_model_cli")


@pytest.mark.jax
def test_megablox_matches_float64_reference_in_interpreter():
    out = _run("check_interpret")
    assert "OK interpret float32" in out and "OK interpret bfloat16" in out


@pytest.mark.jax
def test_megablox_rows_split_over_a_mesh():
    out = _run("check_interpret_mesh")
    assert "OK interpret_mesh 7_groups" in out and "OK interpret_mesh 8_groups" in out


@pytest.mark.jax
def test_dropless_layer_compiles_for_tpu_with_megablox():
    assert "OK tpu_layer" in _run("check_tpu_layer", env=TPU_ENV)


@pytest.mark.jax
def test_tiny_model_dropless_train_step_compiles_for_tpu():
    assert "OK tiny_model_cli" in _run("check_tiny_model_cli", env=TPU_ENV)


def test_bad_kernel_names_the_argument():
    import keras

    from keras_moe.dispatch.grouped_matmul import grouped_matmul

    if keras.backend.backend() != "tensorflow":
        pytest.skip("checks the TensorFlow backend's refusal of the JAX kernels")

    x, w = np.ones((4, 2), "float32"), np.ones((2, 2, 3), "float32")
    with pytest.raises(ValueError, match="`kernel` must be one of"):
        grouped_matmul(x, w, np.array([1, 2]), kernel="cutlass")
    # The suite's backend is TensorFlow: the JAX kernels are refused by name.
    with pytest.raises(ValueError, match="kernel='auto'"):
        grouped_matmul(x, w, np.array([1, 2]), kernel="megablox")


if __name__ == "__main__":
    globals()[sys.argv[1]]()
