"""Helpers shared by the core-layer tests."""

import os
import subprocess
import sys

import numpy as np
import tensorflow as tf

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


# For JAX processes that check values, not compiled programs: XLA skips most of
# its optimisation passes, which cost more than the tiny programs they speed up
# (tests/core/jax_backend_checks.py: 119 s -> 100 s). Not for the checks that
# read collectives or memory off compiled programs (sharding, compile tests).
JAX_NUMERICS_ENV = {"JAX_DISABLE_MOST_OPTIMIZATIONS": "1"}


def run_jax_checks(script, checks):
    """Runs tests/core/`script` with KERAS_BACKEND=jax in a fresh process (the backend is
    fixed per process) and asserts it printed "OK <check>" for each of `checks`."""
    env = dict(
        os.environ,
        KERAS_BACKEND="jax",
        JAX_PLATFORMS="cpu",
        TF_CPP_MIN_LOG_LEVEL="3",
        **JAX_NUMERICS_ENV,
    )
    result = subprocess.run(
        [sys.executable, os.path.join(ROOT, "tests", "core", script)],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    for check in checks:
        assert f"OK {check}" in result.stdout


def inputs_and_mask(rng, shape=(4, 10, 12), padding=0.15):
    """Random float32 tokens of `shape` and a mask with about `padding` of them masked."""
    x = rng.normal(size=shape).astype("float32")
    return x, (rng.random(shape[:-1]) > padding).astype("float32")


def with_same_weights(a, b, input_shape):
    """Builds layers `a` and `b` for `input_shape` and gives `b` the weights of `a`."""
    a.build(input_shape)
    b.build(input_shape)
    b.set_weights(a.get_weights())
    return a, b


def forward_and_gradients(layer, x, mask):
    """(outputs, [gradient of the input, then of every trainable weight], losses) of one
    call at inference capacity, for an objective that weights each output channel differently."""
    xt = tf.constant(x)
    with tf.GradientTape() as tape:
        tape.watch(xt)
        out = layer(xt, mask=mask, training=False)
        y = out[0] if isinstance(out, tuple) else out
        objective = tf.reduce_sum(y * tf.sin(tf.range(x.shape[-1], dtype=tf.float32)))
        objective += tf.add_n(layer.losses)
    grads = tape.gradient(objective, [xt] + layer.trainable_weights)
    return out, [np.asarray(g) for g in grads], [float(v) for v in layer.losses]


def assert_same_outputs_and_gradients(a, b):
    """Compares two `forward_and_gradients` results (outputs, gradients, losses)."""
    ya = a[0][0] if isinstance(a[0], tuple) else a[0]
    yb = b[0][0] if isinstance(b[0], tuple) else b[0]
    np.testing.assert_allclose(np.asarray(ya), np.asarray(yb), rtol=1e-5, atol=1e-6)
    for ga, gb in zip(a[1], b[1], strict=False):
        np.testing.assert_allclose(ga, gb, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(a[2], b[2], rtol=1e-5)


def check_dropless_choice():
    """dispatch="auto" never picks dropless (a capacity dispatch on every platform), and an
    explicit dropless warns nowhere: on JAX on a CPU its grouped matmul is the tiled kernel."""
    import warnings

    import keras_moe

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        layers = [
            keras_moe.SwitchFeedForward(4, 8, dispatch="dropless"),
            keras_moe.GShardFeedForward(4, 8, dispatch="dropless"),
            keras_moe.SwitchFeedForward(4, 8),
        ]
    assert not [str(w.message) for w in caught if "dispatch=" in str(w.message)]
    assert [layer.dispatcher.name for layer in layers] == ["dropless", "dropless", "gather"]
