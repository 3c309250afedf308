"""Tokens to experts by all-to-all or by GSPMD's choice: collectives and bytes per chip.

One Switch MoE layer (einsum dispatch) is compiled for a TPU slice with libtpu's
compiler on this host (no TPU needed), experts split over the slice's chips,
groups (one per sequence) over every chip, in two modes of
`keras_moe.parallel.token_exchange`: "all_to_all" (`jax.shard_map` + `jax.lax.all_to_all`)
and "gspmd" (the layout constraints alone). For the forward pass and for the
forward + backward pass (gradients of the tokens and of the weights) it records
each collective of the compiled program, its per-chip bytes and the bytes a chip
receives (`keras_moe.tpu_compile.hlo_collectives`), and checks the numbers of the
two modes against each other on 8 emulated CPU devices (outputs and gradients).

    python benchmarks/expert_exchange.py                       # Switch-Base layer, v5e:4x4
    python benchmarks/expert_exchange.py --topology v4:2x2x2 --batch 64

Writes benchmarks/results/expert_exchange.json.
"""

import argparse
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

# What keras_moe.tpu_compile.compile_only.setup_environment sets, before keras is imported.
for key, value in (
    ("KERAS_BACKEND", "jax"),
    ("TPU_SKIP_MDS_QUERY", "1"),
    ("TPU_WORKER_HOSTNAMES", "localhost"),
    ("ALLOW_MULTIPLE_LIBTPU_LOAD", "1"),
):
    os.environ.setdefault(key, value)
os.environ["JAX_PLATFORMS"] = "cpu"

import jax  # noqa: E402
import keras  # noqa: E402

import keras_moe  # noqa: E402
from keras_moe.parallel import (  # noqa: E402
    abstract_arrays,
    sharding,
    token_exchange,
)
from keras_moe.tpu_compile import compile_only, hlo_collectives  # noqa: E402


def build_layer(args):
    return keras_moe.MoeLayer(
        keras_moe.SwitchRouter(num_experts=args.experts),
        keras_moe.FeedForwardExperts(num_experts=args.experts, d_ff=args.d_ff),
        group_size="sequence",
        dispatch="einsum",
        train_capacity_factor=args.capacity_factor,
        track_metrics=False,
    )


def compile_layer(args, devices, mode):
    """{"forward": ..., "forward_backward": ...} collectives of the layer under `mode`."""
    token_exchange.set_expert_exchange(mode)
    distribution = sharding.configure_mesh(
        {"data": 1, "expert": len(devices), "model": 1}, devices=devices, num_experts=args.experts
    )
    try:
        with keras.StatelessScope(initialize_variables=False):
            layer = build_layer(args)
            layer.build((args.batch, args.length, args.d_model))
        weights = abstract_arrays.abstract_variables(
            layer.trainable_variables, distribution, args.dtype
        )
        # The seed generator's state.
        state = abstract_arrays.abstract_variables(layer.non_trainable_variables, distribution)
        shape = (args.batch, args.length, args.d_model)
        tokens_layout = sharding.layouts.tensor_layout(
            ("batch", "length", "embed"),
            distribution.device_mesh,
            sharding.get_logical_axis_rules(),
            shape,
        )
        x = abstract_arrays.abstract_array(
            shape, args.dtype, distribution.device_mesh, tokens_layout
        )

        def forward(weights, state, x):
            return layer.stateless_call(weights, state, x, training=True)[0]

        def forward_backward(weights, state, x):
            return jax.grad(
                lambda w, x: jax.numpy.sum(forward(w, state, x).astype("float32") ** 2),
                argnums=(0, 1),
            )(weights, x)

        out = {}
        for name, fn in (("forward", forward), ("forward_backward", forward_backward)):
            compiled = jax.jit(fn).lower(weights, state, x).compile()
            found = hlo_collectives.collectives(compiled.as_text())
            memory = compiled.memory_analysis()
            out[name] = {
                "summary": hlo_collectives.summarize(compiled.as_text()),
                "collectives": [c._asdict() for c in found],
                "token_received_bytes": sum(
                    c.received_bytes
                    for c in found
                    if c.kind in ("all-to-all", "all-gather", "collective-permute")
                ),
                "temp_bytes": int(memory.temp_size_in_bytes),
                "flops_per_chip": float(compiled.cost_analysis().get("flops", float("nan"))),
            }
        return out
    finally:
        sharding.clear_mesh()
        token_exchange.set_expert_exchange("auto")


def main(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--topology", nargs="+", default=["v5e:4x4"])
    parser.add_argument("--batch", type=int, default=128, help="sequences (one group each)")
    parser.add_argument("--length", type=int, default=512)
    parser.add_argument("--d_model", type=int, default=768)
    parser.add_argument("--d_ff", type=int, default=3072)
    parser.add_argument("--experts", type=int, default=128)
    parser.add_argument("--capacity_factor", type=float, default=1.25)
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--output", default=os.path.join(HERE, "results", "expert_exchange.json"))
    args = parser.parse_args(argv)
    results = {
        "setting": {k: v for k, v in vars(args).items() if k != "output"},
        "command": "python benchmarks/expert_exchange.py " + " ".join(argv or sys.argv[1:]),
        "jax": jax.__version__,
        "topologies": {},
    }
    for topology in args.topology:
        devices = compile_only.topology_devices(topology)
        per_mode = {mode: compile_layer(args, devices, mode) for mode in ("all_to_all", "gspmd")}
        results["topologies"][topology] = per_mode
        for mode, passes in per_mode.items():
            for name, res in passes.items():
                counts = {k: v["count"] for k, v in res["summary"].items() if v["count"]}
                print(
                    f"{topology} {mode:10s} {name:16s} {counts} received per chip "
                    f"{res['token_received_bytes'] / 2**20:.1f} MiB (all-to-all/gather/"
                    f"permute), temp {res['temp_bytes'] / 2**20:.0f} MiB"
                )
    os.makedirs(os.path.dirname(args.output), exist_ok=True)
    with open(args.output, "w") as f:
        json.dump(results, f, indent=1)
    print("wrote", args.output)


if __name__ == "__main__":
    main()
