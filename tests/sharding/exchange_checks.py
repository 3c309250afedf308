"""Checks of keras_moe.parallel.token_exchange, run in a fresh process by conftest.py.

8 emulated CPU devices (mesh data=2, expert=4): a Switch MoE layer's outputs
and gradients (tokens and weights) with the all-to-all exchange and with GSPMD's,
against the same layer without a mesh. Then the layer compiled for a v5e:2x2
TPU slice with libtpu's compiler: the collectives of its forward and backward.
Prints one line "RESULT <json>".
"""

import json
import os

os.environ.update(
    ALLOW_MULTIPLE_LIBTPU_LOAD="1", TPU_SKIP_MDS_QUERY="1", TPU_WORKER_HOSTNAMES="localhost"
)

import jax
import keras
import numpy as np

import keras_moe
from keras_moe.parallel import abstract_arrays, sharding, token_exchange
from keras_moe.tpu_compile import hlo_collectives

E, D, F = 8, 16, 32


def make_layer(group_size="sequence", pad_to_group_size=False):
    return keras_moe.MoeLayer(
        keras_moe.SwitchRouter(num_experts=E),
        keras_moe.FeedForwardExperts(num_experts=E, d_ff=F),
        group_size=group_size,
        dispatch="einsum",
        train_capacity_factor=1.0,
        track_metrics=False,
        pad_to_group_size=pad_to_group_size,
    )


def loss_and_grads(layer, x):
    state = [v.value for v in layer.non_trainable_variables]

    def loss(weights, x):
        y, _ = layer.stateless_call(weights, state, x, training=True)
        return jax.numpy.sum(y * y), y

    (value, y), grads = jax.jit(jax.value_and_grad(loss, argnums=(0, 1), has_aux=True))(
        [v.value for v in layer.trainable_variables], x
    )
    return np.asarray(y, "float64"), [np.asarray(g, "float64") for g in (*grads[0], grads[1])]


def numerics():
    x = np.random.default_rng(0).normal(size=(16, 12, D)).astype("float32")
    keras.utils.set_random_seed(1)
    reference = make_layer()
    reference.build(x.shape)
    weights = reference.get_weights()
    y_ref, g_ref = loss_and_grads(reference, x)
    out = {"dropped_any": bool(np.any(np.all(y_ref == 0, axis=-1)))}
    for mode in ("all_to_all", "gspmd"):
        token_exchange.set_expert_exchange(mode)
        sharding.configure_mesh({"data": 2, "expert": 4})
        try:
            layer = make_layer()
            layer.build(x.shape)
            layer.set_weights(weights)
            y, grads = loss_and_grads(layer, x)
            scale = max(float(np.abs(g).max()) for g in g_ref)
            out[mode] = {
                "max_y_diff": float(np.abs(y - y_ref).max()),
                "max_grad_diff": max(
                    float(np.abs(a - b).max()) for a, b in zip(grads, g_ref, strict=False)
                ),
                "grad_scale": scale,
            }
            if mode == "all_to_all":
                try:  # 3 sequences: the mesh cannot split them, one "batch" group
                    make_layer(group_size="batch")(x[:3])
                    out["batch_group_error"] = None
                except ValueError as e:
                    out["batch_group_error"] = str(e)
        finally:
            sharding.clear_mesh()
            token_exchange.set_expert_exchange("auto")
    return out


def local_groups():
    """ "batch" and integer groups on meshes that split the batch 8 ways, against the
    layer without a mesh applied to each shard's 2 sequences (16 x 12 tokens)."""
    x = np.random.default_rng(2).normal(size=(16, 12, D)).astype("float32")
    shards = np.split(x, 8)
    out = {}
    # 24 tokens per shard: 8 divides them; 40 pads each shard to one group.
    for group_size in ("batch", 8, 40):
        keras.utils.set_random_seed(3)
        reference = make_layer(group_size, pad_to_group_size=True)
        reference.build(x.shape)
        weights = reference.get_weights()
        per_shard = np.concatenate([np.asarray(reference(s, training=True)) for s in shards])
        whole = np.asarray(reference(x, training=True))  # one device's grouping of all 16
        for mesh in ({"data": 2, "expert": 4}, {"data": 8}, {"expert": 8}):
            sharding.configure_mesh(mesh)
            token_exchange.clear_exchange_choices()
            try:
                layer = make_layer(group_size, pad_to_group_size=True)
                layer.build(x.shape)
                layer.set_weights(weights)
                y = np.asarray(jax.jit(lambda x: layer(x, training=True))(x))  # noqa: B023 - called in this iteration
                choices = token_exchange.exchange_choices()
            finally:
                sharding.clear_mesh()
            out[f"{group_size} {mesh}"] = {
                "max_diff_per_shard": float(np.abs(y - per_shard).max()),
                "max_diff_whole": float(np.abs(y - whole).max()),
                "dropped_per_shard": int(np.all(per_shard == 0, axis=-1).sum()),
                "exchanges": [c["exchange"] for c in choices],
            }
    sharding.configure_mesh({"data": 2, "expert": 4})
    try:
        make_layer(group_size=16)(x)  # 24 tokens per shard
        out["indivisible_error"] = None
    except ValueError as e:
        out["indivisible_error"] = str(e)
    finally:
        sharding.clear_mesh()
    return out


def tpu_collectives():
    from keras_moe.tpu_compile.compile_only import topology_devices

    devices = topology_devices("v5e:2x2")
    out = {}
    for mode in ("all_to_all", "gspmd"):
        token_exchange.set_expert_exchange(mode)
        distribution = sharding.configure_mesh({"data": 1, "expert": 4}, devices=devices)
        try:
            with keras.StatelessScope(initialize_variables=False):
                layer = make_layer()
                layer.build((8, 32, D))
            mesh = distribution.device_mesh
            weights = abstract_arrays.abstract_variables(layer.trainable_variables, distribution)
            state = [
                abstract_arrays.abstract_array(v.shape, v.dtype, mesh)  # replicated
                for v in layer.non_trainable_variables
            ]
            x = abstract_arrays.abstract_array(
                (8, 32, D), "float32", mesh, jax.sharding.PartitionSpec("expert")
            )

            def forward(weights, state, x):
                return layer.stateless_call(weights, state, x, training=True)[0]  # noqa: B023 - called in this iteration

            def backward(weights, state, x):
                return jax.grad(
                    lambda w, x: jax.numpy.sum(forward(w, state, x) ** 2), argnums=(0, 1)
                )(weights, x)

            out[mode] = {}
            for name, fn in (("forward", forward), ("forward_backward", backward)):
                hlo = jax.jit(fn).lower(weights, state, x).compile().as_text()
                out[mode][name] = [c._asdict() for c in hlo_collectives.collectives(hlo)]
        finally:
            sharding.clear_mesh()
            token_exchange.set_expert_exchange("auto")
    return out


def _dropless_layer(k, **kwargs):
    return keras_moe.MoeLayer(
        keras_moe.TopKRouter(E, k=k),
        keras_moe.FeedForwardExperts(E, F),
        dispatch="dropless",
        track_metrics=False,
        **kwargs,
    )


def _dropless_run(layer, x):
    """Outputs, losses and gradients (weights, then x) of sum(y^2), float64."""
    state = [v.value for v in layer.non_trainable_variables]

    def loss(weights, x):
        y, _, losses = layer.stateless_call(weights, state, x, training=True, return_losses=True)
        return jax.numpy.sum(y * y), (y, losses)

    (_, (y, losses)), grads = jax.jit(jax.value_and_grad(loss, argnums=(0, 1), has_aux=True))(
        [v.value for v in layer.trainable_variables], x
    )
    return (
        np.asarray(y, "float64"),
        np.asarray(losses, "float64"),
        [np.asarray(g, "float64") for g in (*grads[0], grads[1])],
    )


def dropless():
    """Dropless with the experts split over 'expert' (data=2, expert=4) against the same
    layer without a mesh: outputs and gradients of all 16 sequences, and the aux and z
    losses of each shard's own 2 sequences (its "batch" group), averaged."""
    x = np.random.default_rng(4).normal(size=(16, 12, D)).astype("float32")
    out = {}
    for k in (1, 2):
        keras.utils.set_random_seed(5)
        reference = _dropless_layer(k)
        reference.build(x.shape)
        weights = reference.get_weights()
        y_ref, _, g_ref = _dropless_run(reference, x)
        losses_ref = np.mean([_dropless_run(reference, s)[1] for s in np.split(x, 8)], axis=0)
        sharding.configure_mesh({"data": 2, "expert": 4})
        token_exchange.clear_exchange_choices()
        try:
            layer = _dropless_layer(k)
            layer.build(x.shape)
            layer.set_weights(weights)
            y, losses, grads = _dropless_run(layer, x)
            choices = token_exchange.exchange_choices()
        finally:
            sharding.clear_mesh()
        out[f"top{k}"] = {
            "max_y_diff": float(np.abs(y - y_ref).max()),
            "y_scale": float(np.abs(y_ref).max()),
            "max_loss_diff": float(np.abs(losses - losses_ref).max()),
            "max_grad_diff": max(
                float(np.abs(a - b).max()) for a, b in zip(grads, g_ref, strict=False)
            ),
            "grad_scale": max(float(np.abs(g).max()) for g in g_ref),
            "exchanges": [c["exchange"] for c in choices],
        }
    # A receive buffer of 0.6 x a device's rows: the rows past it are dropped, counted.
    keras.utils.set_random_seed(5)
    reference = _dropless_layer(1, return_metrics=True, dropless_buffer_factor=0.6)
    reference.build(x.shape)
    y_ref = np.asarray(reference(x)[0])
    sharding.configure_mesh({"data": 2, "expert": 4})
    try:
        layer = _dropless_layer(1, return_metrics=True, dropless_buffer_factor=0.6)
        layer.build(x.shape)
        layer.set_weights(reference.get_weights())
        y, stats = jax.jit(lambda x: layer(x, training=True))(x)
    finally:
        sharding.clear_mesh()
    y = np.asarray(y)
    zero = np.all(y == 0, axis=-1)
    out["buffer_0.6"] = {
        "zero_fraction": float(zero.mean()),
        "dropped_fraction": float(stats["dropped_fraction"]),
        "max_diff_of_the_others": float(np.abs(y - y_ref)[~zero].max()),
    }
    return out


def dropless_tpu_collectives():
    """The dropless layer with its experts split over v5e:2x2's 4 chips, forward and backward."""
    from keras_moe.tpu_compile.compile_only import topology_devices

    distribution = sharding.configure_mesh(
        {"data": 1, "expert": 4}, devices=topology_devices("v5e:2x2")
    )
    try:
        with keras.StatelessScope(initialize_variables=False):
            layer = _dropless_layer(1)
            layer.build((8, 32, D))
        mesh = distribution.device_mesh
        weights = abstract_arrays.abstract_variables(layer.trainable_variables, distribution)
        state = [
            abstract_arrays.abstract_array(v.shape, v.dtype, mesh)
            for v in layer.non_trainable_variables
        ]
        x = abstract_arrays.abstract_array(
            (8, 32, D), "float32", mesh, jax.sharding.PartitionSpec("expert")
        )

        def backward(weights, state, x):
            def loss(w, x):
                return jax.numpy.sum(layer.stateless_call(w, state, x, training=True)[0] ** 2)

            return jax.grad(loss, argnums=(0, 1))(weights, x)

        hlo = jax.jit(backward).lower(weights, state, x).compile().as_text()
        return [c._asdict() for c in hlo_collectives.collectives(hlo, 4)]
    finally:
        sharding.clear_mesh()


if __name__ == "__main__":
    assert keras.backend.backend() == "jax" and len(jax.devices()) == 8, jax.devices()
    print(
        "RESULT "
        + json.dumps(
            {
                "numerics": numerics(),
                "local_groups": local_groups(),
                "tpu": tpu_collectives(),
                "dropless": dropless(),
                "dropless_tpu": dropless_tpu_collectives(),
            }
        )
    )
