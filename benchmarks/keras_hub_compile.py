"""Qwen3-30B-A3B's published shape, sparsified, compiled for a TPU slice on this CPU host.

Builds keras-hub's `Qwen3MoeCausalLM` from the published config (48 layers, 128 experts
top-8, d_model 2048; abstract weights: nothing is downloaded or allocated), sparsifies it,
and compiles one `fit` train step for a TPU slice with the experts split over the mesh's
"expert" axis (`keras_moe.tpu_compile.compile_model.compile_model_train_step`). With
`--also-keras-hub` it compiles keras-hub's own (dense-loop) model of the same shape too,
its expert banks split over "expert" the same way, for the roofline side by side.

    python benchmarks/keras_hub_compile.py                           # v5p:4x4x4, 48 layers
    python benchmarks/keras_hub_compile.py --layers 4 --also-keras-hub
    python benchmarks/keras_hub_compile.py --smoke                   # 2 layers, 8 CPU devices
"""

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# Before keras and jax are imported (keras_moe imports keras): what
# keras_moe.tpu_compile.tpu_topology.setup_environment() sets, and 8 CPU devices
# for --smoke.
os.environ.update(
    KERAS_BACKEND="jax",
    JAX_PLATFORMS="cpu",
    TPU_SKIP_MDS_QUERY="1",
    TPU_WORKER_HOSTNAMES="localhost",
    ALLOW_MULTIPLE_LIBTPU_LOAD="1",
)
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")

import keras  # noqa: E402
import keras_hub  # noqa: E402

import keras_moe  # noqa: E402
from benchmarks import common  # noqa: E402
from keras_moe.parallel import layouts
from keras_moe.tpu_compile.compile_model import compile_model_train_step  # noqa: E402

# Qwen/Qwen3-30B-A3B's config.json, in keras-hub's names.
QWEN3_30B_A3B = dict(
    vocabulary_size=151936,
    num_layers=48,
    num_query_heads=32,
    num_key_value_heads=4,
    hidden_dim=2048,
    intermediate_dim=6144,
    moe_intermediate_dim=768,
    head_dim=128,
    num_experts=128,
    top_k=8,
    norm_top_k_prob=True,
    rope_max_wavelength=1e6,
    layer_norm_epsilon=1e-6,
    tie_word_embeddings=False,
)
# keras-hub's expert banks, for its own model: split over "expert" like keras_moe's experts.
layouts.register_variable_axes(
    r".*experts/expert_feedforward_gate_dense", {3: ("expert", "embed", "mlp")}
)
layouts.register_variable_axes(
    r".*experts/expert_feedforward_output_dense", {3: ("expert", "mlp", "embed")}
)


def build(config, sparse, buffer_factor):
    def build_model():
        backbone = keras_hub.models.Qwen3MoeBackbone(**config)
        model = keras_hub.models.Qwen3MoeCausalLM(backbone=backbone, preprocessor=None)
        if sparse:
            keras_moe.sparsify(model, dropless_buffer_factor=buffer_factor)
        model.compile(
            optimizer=keras.optimizers.Adam(1e-4),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            weighted_metrics=None,
        )
        return model

    return build_model


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--topology", default="v5p:4x4x4")
    parser.add_argument("--mesh", default='{"data": 4, "expert": 16}')
    parser.add_argument("--layers", type=int, default=48)
    parser.add_argument("--batch", type=int, default=64)  # one sequence per chip
    parser.add_argument("--length", type=int, default=2048)
    parser.add_argument("--dtype-policy", default="mixed_bfloat16")
    parser.add_argument("--also-keras-hub", action="store_true")
    parser.add_argument(
        "--buffer-factor",
        type=float,
        default=2.0,
        help="dropless_buffer_factor: each chip's receive buffer in multiples "
        "of its own token-expert assignments",
    )
    parser.add_argument("--smoke", action="store_true")
    args = parser.parse_args(argv)
    config = dict(QWEN3_30B_A3B, num_layers=args.layers)
    topology, mesh = args.topology, json.loads(args.mesh)
    if args.smoke:
        common.use_smoke_results()
        config.update(
            num_layers=2,
            vocabulary_size=1024,
            hidden_dim=64,
            num_query_heads=4,
            num_key_value_heads=2,
            head_dim=16,
            moe_intermediate_dim=32,
            num_experts=16,
            top_k=4,
        )
        topology, mesh, args.batch, args.length = None, {"data": 2, "expert": 4}, 8, 32
    tokens = ((args.batch, args.length), "int32")
    batch = (
        {"token_ids": tokens, "padding_mask": tokens},
        tokens,
        ((args.batch, args.length), "float32"),
    )
    rows = {}
    for name, sparse in (("sparse", True), ("keras_hub", False)):
        if name == "keras_hub" and not args.also_keras_hub:
            continue
        report = compile_model_train_step(
            build(config, sparse, args.buffer_factor),
            batch,
            topology=topology,
            mesh_shape=mesh,
            dtype_policy=args.dtype_policy,
        )
        rows[name] = report
        print(
            name,
            json.dumps(
                {
                    k: report.get(k)
                    for k in (
                        "parameters",
                        "fits",
                        "peak_bytes",
                        "hbm_bytes",
                        "flops_per_chip",
                        "expert_weights",
                        "expert_weight_all_gathers",
                        "collectives",
                        "roofline",
                        "compile_seconds",
                        "error",
                    )
                }
            ),
            flush=True,
        )
    path = common.write_result(
        f"keras_hub_compile_{args.layers}l",
        {
            "environment": common.environment(),
            "topology": topology,
            "mesh": mesh,
            "config": config,
            "batch": [args.batch, args.length],
            "dtype_policy": args.dtype_policy,
            "dropless_buffer_factor": args.buffer_factor,
            "rows": rows,
        },
    )
    print("wrote", path)


if __name__ == "__main__":
    main()
