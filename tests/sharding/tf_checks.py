"""TensorFlow expert-parallel checks on 8 logical CPUs, run by
test_tf_expert_parallel.py in a subprocess (the logical devices must be set
before TensorFlow initialises). Prints one JSON line prefixed "RESULT ".
"""

import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
os.environ["KERAS_BACKEND"] = "tensorflow"

import numpy as np
import tensorflow as tf

N = 8
tf.config.set_logical_device_configuration(
    tf.config.list_physical_devices("CPU")[0], [tf.config.LogicalDeviceConfiguration()] * N
)

import keras  # noqa: E402

from keras_moe.layers.expert_parallel import ExpertParallelExperts, expert_parallel_switch  # noqa: E402

t0 = time.time()
E, D, B, L = 8, 8, 16, 8  # 2 sequences (groups) per replica
out = {}
rs = np.random.RandomState(0)
x = rs.randn(B, L, D).astype("float32")
r = rs.randn(B, L, D).astype("float32")
strategy = tf.distribute.MirroredStrategy([f"/cpu:{i}" for i in range(N)])


def make_layer(dispatch, activation="relu"):
    return expert_parallel_switch(
        E,
        16,
        activation=activation,
        dispatch=dispatch,
        min_expert_capacity=2,
        track_metrics=False,
        name="moe",
        group_size="sequence",
    )


def single_device(layer, xs, rs_):
    with tf.GradientTape() as tape:
        y = layer(xs, training=True)
        loss = tf.reduce_sum(y * rs_) + tf.add_n(layer.losses)
    return y, loss, tape.gradient(loss, layer.trainable_weights)


for dispatch, activation in (("gather", "relu"), ("einsum", "gated-gelu")):
    keras.utils.set_random_seed(1)
    ref = make_layer(dispatch, activation)
    ref(x[:2])
    w0 = ref.get_weights()
    y_ref, loss_ref, g_ref = single_device(ref, x, r)
    with strategy.scope():
        layer = make_layer(dispatch, activation)
        layer(x[:2])
        layer.set_weights(w0)

    n_losses = []

    def replica_fn(xs, rs_, layer=layer, n_losses=n_losses):  # bound: defined in a loop
        ctx = tf.distribute.get_replica_context()
        with tf.GradientTape() as tape:
            y = layer(xs, training=True)
            # Aux losses are per-replica means: divide by N so the sum is the global mean.
            loss = tf.reduce_sum(y * rs_) + tf.add_n(layer.losses) / N
        grads = tape.gradient(loss, layer.trainable_weights)
        grads = [ctx.all_reduce("sum", tf.convert_to_tensor(g)) for g in grads]
        n_losses.append(len(layer.losses))
        return y, ctx.all_reduce("sum", loss), grads

    @tf.function
    def run(xd, rd):
        return strategy.run(replica_fn, args=(xd, rd))

    ds = tf.data.Dataset.from_tensor_slices((x, r)).batch(B)
    xd, rd = next(iter(strategy.experimental_distribute_dataset(ds)))
    y_d, loss_d, g_d = run(xd, rd)
    y_d = np.concatenate([v.numpy() for v in strategy.experimental_local_results(y_d)])
    loss_d = strategy.experimental_local_results(loss_d)[0].numpy()
    g_d = [strategy.experimental_local_results(g)[0].numpy() for g in g_d]
    out[dispatch + "/" + activation] = {
        "local_experts": layer.experts.local_experts,
        "max_out_diff": float(np.abs(y_d - y_ref.numpy()).max()),
        "max_out": float(np.abs(y_ref.numpy()).max()),
        "loss": float(loss_d),
        "ref_loss": float(loss_ref.numpy()),
        "max_grad_diff": max(
            float(np.abs(a - b.numpy()).max()) for a, b in zip(g_d, g_ref, strict=False)
        ),
        "num_losses": n_losses[0],
        "ref_num_losses": len(ref.losses),
        "ref_aux": [float(v) for v in ref.losses],
        "grad_names": [w.path for w in layer.trainable_weights],
        "max_grad": max(float(np.abs(b.numpy()).max()) for b in g_ref),
    }
out["time_grads"] = time.time() - t0

# model.fit under MirroredStrategy(8) vs the same model on one device.
y_target = rs.randn(B, L, D).astype("float32")


def make_model():
    inp = keras.Input((L, D))
    h = make_layer("gather")(inp)
    return keras.Model(inp, keras.layers.Dense(D, name="head")(h))


keras.utils.set_random_seed(2)
ref_model = make_model()
w0 = ref_model.get_weights()
ref_model.compile(keras.optimizers.SGD(0.1), "mse")
ref_hist = ref_model.fit(x, y_target, batch_size=B, epochs=2, verbose=0, shuffle=False)
with strategy.scope():
    model = make_model()
    model.set_weights(w0)
    model.compile(keras.optimizers.SGD(0.1), "mse")
hist = model.fit(x, y_target, batch_size=B, epochs=2, verbose=0, shuffle=False)
out["fit"] = {
    "loss": [float(v) for v in hist.history["loss"]],
    "ref_loss": [float(v) for v in ref_hist.history["loss"]],
    "max_weight_diff": max(
        float(np.abs(a - b).max())
        for a, b in zip(model.get_weights(), ref_model.get_weights(), strict=False)
    ),
    "weight_change": max(
        float(np.abs(a - b).max()) for a, b in zip(ref_model.get_weights(), w0, strict=False)
    ),
    "local_experts": model.get_layer("moe").experts.local_experts,
}

# Bad input: 6 experts over 8 replicas.
with strategy.scope():
    bad = ExpertParallelExperts(6, 4, name="bad")
    bad.build((6, None, None, D))
try:
    strategy.run(tf.function(lambda t: bad(t)), args=(tf.ones((6, 1, 2, D)),))
    out["indivisible_error"] = None
except ValueError as e:
    out["indivisible_error"] = str(e)
out["time"] = time.time() - t0
print("RESULT " + json.dumps(out))
