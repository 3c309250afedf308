"""JAX-backend sharding checks, run by test_jax_sharding.py in a subprocess.

Needs KERAS_BACKEND=jax and XLA_FLAGS=--xla_force_host_platform_device_count=8
set before start. Prints one JSON line (prefixed "RESULT ") with what it saw;
the pytest side asserts on it.
"""

import functools
import json
import os
import re
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import jax
import keras
import numpy as np

import keras_moe
from keras_moe.parallel import sharding

COLLECTIVES = ("all-to-all", "all-reduce", "all-gather", "reduce-scatter", "collective-permute")
E, D, B, L = 8, 16, 8, 16
out = {"devices": len(jax.devices()), "backend": keras.backend.backend()}
t0 = time.time()


def count_collectives(hlo):
    return {k: len(re.findall(r"\s" + k + r"(-start)?\(", hlo)) for k in COLLECTIVES}


def build(dispatch):
    inp = keras.Input((L, D), batch_size=B)
    h = keras_moe.SwitchFeedForward(
        num_experts=E,
        d_ff=32,
        dispatch=dispatch,
        min_expert_capacity=2,
        name="moe",
        group_size="sequence",
    )(inp)  # groups shard over data
    return keras.Model(inp, keras.layers.Dense(D, name="head")(h))


def loss_and_grads(model, x, y):
    """Loss (MSE + the layer's aux/z losses) and its gradients, jitted."""
    ntv = [v.value for v in model.non_trainable_variables]

    def f(tv):
        pred, _, losses = model.stateless_call(tv, ntv, x, training=True, return_losses=True)
        return keras.ops.mean((pred - y) ** 2) + sum(losses)

    loss, grads = jax.jit(jax.value_and_grad(f))([v.value for v in model.trainable_variables])
    return float(loss), [np.asarray(g) for g in grads]


def train_step_hlo(model, x, y):
    state = tuple(
        [v.value for v in s]
        for s in (
            model.trainable_variables,
            model.non_trainable_variables,
            model.optimizer.variables,
            model.metrics_variables,
        )
    )
    return jax.jit(model.train_step).lower(state, (x, y)).compile().as_text()


rs = np.random.RandomState(0)
x = rs.randn(B, L, D).astype("float32")
y = rs.randn(B, L, D).astype("float32")

# 1. No mesh: the annotation is the identity, on this backend too.
out["noop_identity"] = sharding.with_logical_constraint(x, ("batch", "length", "embed")) is x

# 2. Unsharded references (no distribution set yet).
keras.utils.set_random_seed(0)
weights, ref = {}, {}
for dispatch in ("einsum", "gather"):
    model = build(dispatch)
    weights[dispatch] = model.get_weights()
    ref[dispatch] = loss_and_grads(model, x, y)

# 3. Sharded runs.
out["meshes"] = {}
for mesh, dispatches in (((2, 4), ("einsum", "gather")), ((1, 8), ("einsum",))):
    key = f"data={mesh[0]},expert={mesh[1]}"
    dist = sharding.configure_mesh({"data": mesh[0], "expert": mesh[1]}, num_experts=E)
    data_sharding = dist.get_data_layout(x.shape).backend_layout
    xs, ys = jax.device_put(x, data_sharding), jax.device_put(y, data_sharding)
    res = out["meshes"][key] = {"data_spec": str(data_sharding.spec)}
    for dispatch in dispatches:
        model = build(dispatch)
        model.set_weights(weights[dispatch])
        experts = model.get_layer("moe").experts
        shards = {}
        for name in ("wi", "wo"):
            arr = getattr(experts, name).value
            shards[name] = {
                "spec": str(arr.sharding.spec),
                "shard_shapes": sorted({tuple(s.data.shape) for s in arr.addressable_shards}),
                "num_shards": len(arr.addressable_shards),
                "expert_slices": sorted(
                    {(s.index[0].start or 0, s.index[0].stop or E) for s in arr.addressable_shards}
                ),
            }
        router = model.get_layer("moe").router.kernel.value
        shards["router_spec"] = str(router.sharding.spec)
        loss, grads = loss_and_grads(model, xs, ys)
        ref_loss, ref_grads = ref[dispatch]
        model.compile("sgd", "mse")
        model.optimizer.build(model.trainable_variables)
        hlo_counts = count_collectives(train_step_hlo(model, xs, ys))
        res[dispatch] = {
            "shards": shards,
            "loss": loss,
            "ref_loss": ref_loss,
            "max_grad_diff": max(
                float(np.abs(a - b).max()) for a, b in zip(grads, ref_grads, strict=False)
            ),
            "max_grad": max(float(np.abs(b).max()) for b in ref_grads),
            "hlo": hlo_counts,
        }
    out["time_" + key] = time.time() - t0

# 4. model.fit under the (data=2, expert=4) distribution.
sharding.configure_mesh({"data": 2, "expert": 4})
model = build("einsum")
model.compile("adam", "mse")
hist = model.fit(x, y, batch_size=B, epochs=2, verbose=0)
out["fit_loss"] = [float(v) for v in hist.history["loss"]]

# 5. The tiny Switch T5 (keras_moe.models is part of the package: an ImportError
# here is a failure of these checks, not a reason to skip them).
from keras_moe import SwitchFeedForward  # noqa: E402
from keras_moe.models import build_model  # noqa: E402
from keras_moe.models.config import T5Config  # noqa: E402

cfg = T5Config(
    vocab_size=64,
    d_model=16,
    num_heads=4,
    d_kv=4,
    d_ff=32,
    num_encoder_layers=2,
    num_decoder_layers=2,
    activation="relu",
    encoder_sparse_step=2,
    decoder_sparse_step=2,
    sparse_ffn=functools.partial(
        SwitchFeedForward,
        num_experts=E,
        d_ff=32,
        activation="relu",
        min_expert_capacity=2,
        group_size="sequence",
    ),
)
t5 = build_model(cfg, compile=True)
enc = rs.randint(2, 64, (B, L)).astype("int32")
dec = rs.randint(2, 64, (B, L)).astype("int32")
inputs = {"encoder_input_tokens": enc, "decoder_input_tokens": dec}
hist = t5.fit(inputs, dec, batch_size=B, epochs=1, verbose=0)
out["t5"] = {
    "loss": [float(v) for v in hist.history["loss"]],
    "specs": {v.path: str(v.value.sharding.spec) for v in t5.trainable_variables},
}

# 6. Setup errors.
errors = {}


def expect_error(name, fn):
    try:
        fn()
    except ValueError as e:
        errors[name] = str(e)
    else:
        errors[name] = None


expect_error("mesh_size", lambda: sharding.configure_mesh({"data": 2, "expert": 2}))
expect_error("num_experts", lambda: sharding.configure_mesh({"expert": 8}, num_experts=6))
expect_error(
    "unknown_logical",
    lambda: sharding.configure_mesh({"expert": 8}, rules=(("experts", "expert"),)),
)
expect_error("unknown_mesh_axis", lambda: sharding.configure_mesh({"tensor": 8}))


def build_indivisible():
    sharding.configure_mesh({"data": 2, "expert": 4})
    keras_moe.SwitchFeedForward(num_experts=6, d_ff=8, name="moe6")(np.ones((2, 8, 8), "float32"))


expect_error("indivisible_layer", build_indivisible)


def constrain_unknown():
    sharding.configure_mesh({"data": 2, "expert": 4})
    sharding.with_logical_constraint(jax.numpy.ones((8, 4)), ("batch", "hidden"))


expect_error("unknown_tag", constrain_unknown)
out["errors"] = errors
sharding.clear_mesh()
out["cleared"] = (
    sharding.get_logical_axis_rules() is None and keras.distribution.distribution() is None
)
out["time"] = time.time() - t0
print("RESULT " + json.dumps(out))
