"""Where one MoE layer's forward + backward time goes, per backend, against a dense FFN.

Each stage is timed as its own compiled forward + backward (gradients of the
inputs and of every weight it uses), side by side in one process with
interleaved repetitions:

- `router`: router logits and routing (top-k, positions and capacity, balance
  and z-losses: every output of `Router.route`);
- `dispatch`: router + dispatch and combine with identity experts (the sort,
  the row permutations or gathers and scatters, the weighting);
- `experts`: the expert matmuls alone, on rows already laid out for them (sorted
  rows and their group sizes for dropless; `[E, G, C, d]` buffers for gather);
- `layer`: the whole layer; `layer+metrics`: with its router metrics computed.

The shares are then `router`, `dispatch - router` (moving the tokens),
`experts`, `layer - dispatch - experts` (what fusing the pieces gains or loses)
and `layer+metrics - layer`. `dense` is a dense FFN of the same tokens and
d_model / d_ff (k of them for top-k: the work of the routed tokens).

    python benchmarks/layer_profile.py                   # TensorFlow
    KERAS_BACKEND=jax python benchmarks/layer_profile.py
    python benchmarks/layer_profile.py --smoke           # seconds; checks it runs
"""

import argparse
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import keras
import numpy as np
from keras import ops

import keras_moe
from benchmarks import common
from benchmarks.layer_speed import DenseFeedForward

STAGES = ("router", "dispatch", "experts", "layer", "layer+metrics")
# name: (layer class, experts, d_ff divisor, k)
SHAPES = {
    "switch_e8": ("switch", 8, 1, 1),
    "switch_e32": ("switch", 32, 1, 1),
    "switch_e128": ("switch", 128, 1, 1),
    "fine_grained_e32_top4": ("topk", 32, 4, 4),
}


class IdentityExperts:
    """Experts that return their inputs: what is left of a dispatch is the moving."""

    takes_sorted_rows = True

    def __call__(self, inputs, training=None, group_sizes=None):
        return inputs


class Stage(keras.layers.Layer):
    """One stage of `moe`'s forward pass (see the module docstring)."""

    def __init__(self, moe, stage, **kwargs):
        super().__init__(**kwargs)
        self.moe, self.stage = moe, stage

    def used_weights(self):
        """The weights this stage reads: the ones it differentiates (JAX would otherwise
        write zero gradients for the experts' weights in the router's stage)."""
        if self.stage in ("router", "dispatch"):
            return self.moe.router.trainable_weights
        if self.stage == "experts":
            return self.moe.experts.trainable_weights
        return self.moe.trainable_weights

    def call(self, x, group_sizes=None, training=None):
        moe = self.moe
        if self.stage == "layer":
            return moe(x, training=True)
        if self.stage == "layer+metrics":
            y, stats = moe(x, training=True, return_metrics=True)
            # Kept in the graph (a compiler may not drop them), without changing y's gradient.
            extra = sum(ops.cast(ops.mean(v), y.dtype) for v in stats.values())
            return y + 0.0 * extra
        if self.stage == "experts":
            if group_sizes is None:
                return moe.experts(x, training=True)
            return moe.experts(x, group_sizes=group_sizes, training=True)
        mask = ops.ones(ops.shape(x)[:-1], "float32")
        capacity = moe.capacity(x.shape[1], True)
        routing = moe.router.route(moe.router(x, training=True), mask, capacity, training=True)
        if self.stage == "router":
            weight = ops.cast(routing.combine_weight, x.dtype)
            # Every routing output is used, so that a graph optimiser prunes none of it.
            rest = [routing.expert_index, routing.position, routing.kept, routing.router_probs]
            if routing.selected is not None:
                rest.append(routing.selected)
            unused = sum(ops.sum(ops.cast(t, x.dtype)) for t in rest)
            return (
                ops.sum(weight, axis=-1, keepdims=True) * x
                + routing.aux_loss
                + routing.z_loss
                + 0.0 * unused
            )
        return moe.dispatcher.apply(x, routing, IdentityExperts(), True)


def make_layer(shape, dispatch, d_ff, capacity_factor):
    kind, num_experts, divisor, k = SHAPES[shape]
    common_args = dict(
        train_capacity_factor=capacity_factor,
        dispatch=dispatch,
        group_size="sequence",
        min_expert_capacity=0,
        track_metrics=False,
    )
    if kind == "switch":
        return keras_moe.SwitchFeedForward(num_experts, d_ff // divisor, **common_args)
    return keras_moe.TopKFeedForward(num_experts, d_ff // divisor, k=k, **common_args)


def experts_inputs(layer, shape, x, dispatch, rng):
    """The experts stage's inputs: what the dispatcher hands the experts for `x`."""
    batch, length, d_model = x.shape
    _, num_experts, _, k = SHAPES[shape]
    if dispatch == "dropless":
        rows = batch * length * k
        sizes = np.bincount(rng.integers(0, num_experts, rows), minlength=num_experts)
        data = rng.normal(size=(rows, d_model)).astype("float32")
        return data, sizes.astype("int32")
    capacity = int(layer.capacity(length, True))
    data = rng.normal(size=(num_experts, batch, capacity, d_model)).astype("float32")
    return data, None


def step_fn(layer, x, group_sizes=None):
    """A compiled forward + backward of `layer` on `x`: gradients of x and of every weight
    the layer uses (`used_weights()`, where it has one; else all)."""
    kwargs = {} if group_sizes is None else {"group_sizes": group_sizes}
    layer(x, **kwargs)  # build
    used = layer.used_weights() if hasattr(layer, "used_weights") else layer.trainable_weights
    if keras.backend.backend() == "jax":
        import jax

        trainable = layer.trainable_variables
        chosen = [i for i, v in enumerate(trainable) if any(v is u for u in used)]
        other = [v.value for v in layer.non_trainable_variables]

        def loss(chosen_values, x):
            values = [v.value for v in trainable]
            for i, value in zip(chosen, chosen_values, strict=True):
                values[i] = value
            y, _, losses = layer.stateless_call(
                values, other, x, training=True, return_losses=True, **kwargs
            )
            return ops.mean(ops.square(y)) + sum(losses)

        grad = jax.jit(jax.grad(loss, argnums=(0, 1)))
        x, chosen_values = jax.numpy.asarray(x), [trainable[i].value for i in chosen]
        return lambda: jax.block_until_ready(grad(chosen_values, x))
    import tensorflow as tf

    x = tf.constant(x)

    @tf.function
    def step():
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = layer(x, training=True, **kwargs)
            loss = tf.reduce_mean(tf.square(y))
            if layer.losses:
                loss += tf.add_n(layer.losses)
        return tape.gradient(loss, [x, *used])

    return lambda: [g.numpy() for g in step()[:1]]


def run(args):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(args.tokens // args.seq_len, args.seq_len, args.d_model)).astype("float32")
    functions = {"dense": step_fn(DenseFeedForward(args.d_ff), x)}
    for shape in args.shapes:
        for dispatch in args.dispatch:
            layer = make_layer(shape, dispatch, args.d_ff, args.capacity_factor)
            layer(x[:1])  # build, so that every stage shares the same weights
            for stage in STAGES:
                name = f"{shape}/{dispatch}/{stage}"
                if stage == "experts":
                    data, sizes = experts_inputs(layer, shape, x, dispatch, rng)
                    functions[name] = step_fn(Stage(layer, stage), data, sizes)
                else:
                    functions[name] = step_fn(Stage(layer, stage), x)
    timings = common.interleaved_medians(functions, args.repeats)
    dense = timings["dense"]["median"]
    rows = []
    for shape in args.shapes:
        k = SHAPES[shape][3] // SHAPES[shape][2]  # the dense FFNs of the routed tokens' work
        for dispatch in args.dispatch:
            t = {stage: timings[f"{shape}/{dispatch}/{stage}"]["median"] for stage in STAGES}
            shares = {
                "router": t["router"],
                "moving_tokens": t["dispatch"] - t["router"],
                "expert_matmuls": t["experts"],
                "fusion_rest": t["layer"] - t["dispatch"] - t["experts"],
                "metrics": t["layer+metrics"] - t["layer"],
            }
            cf = 1.0 if dispatch == "dropless" else args.capacity_factor
            rows.append(
                {
                    "shape": shape,
                    "dispatch": dispatch,
                    "stage_s": t,
                    "shares_s": shares,
                    "spread_s": {s: timings[f"{shape}/{dispatch}/{s}"]["spread"] for s in STAGES},
                    "t_dense_s": dense,
                    "layer_vs_dense_same_tokens": t["layer"] / (k * dense),
                    "experts_vs_cf_dense": t["experts"] / (cf * k * dense),
                }
            )
            print(
                f"{shape:22s} {dispatch:8s} layer {t['layer'] * 1e3:7.1f} ms "
                f"= {t['layer'] / (k * dense):.2f}x dense; "
                + ", ".join(f"{key} {value * 1e3:.0f}" for key, value in shares.items()),
                flush=True,
            )
    print(f"dense FFN {dense * 1e3:.1f} ms")
    return rows


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    parser.add_argument(
        "--dispatch",
        nargs="+",
        default=["dropless", "gather"],
        choices=["dropless", "gather", "einsum"],
    )
    parser.add_argument("--tokens", type=int, default=8192)
    parser.add_argument("--seq_len", type=int, default=512)
    parser.add_argument("--d_model", type=int, default=512)
    parser.add_argument("--d_ff", type=int, default=2048)
    parser.add_argument("--capacity_factor", type=float, default=1.25)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument(
        "--output", default=None, help="result name (default: layer_profile_<backend>)"
    )
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, for tests")
    args = parser.parse_args(argv)
    if args.smoke:
        common.use_smoke_results()
        args.tokens, args.seq_len, args.d_model, args.d_ff, args.repeats = 128, 32, 16, 32, 1
        args.shapes = ["switch_e8", "fine_grained_e32_top4"]
    output = args.output or f"layer_profile_{keras.backend.backend()}"
    rows = run(args)
    path = common.write_result(
        output,
        {
            "benchmark": "layer_profile",
            "args": vars(args),
            "environment": common.environment(),
            "rows": rows,
        },
    )
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
