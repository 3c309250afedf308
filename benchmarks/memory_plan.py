"""Per-device memory of the gin job's train step on a JAX mesh, from shapes alone.

For each model and device count, a child process emulates that many CPU
devices, builds the model and its optimizer inside `keras.StatelessScope`
(variables get shapes and layouts, no values), lowers and compiles one
`model.train_step` over abstract arguments carrying the mesh shardings, and
reads the per-device sizes: parameters and optimizer state from the shard
shapes, the step's temporaries (activations kept for the backward pass and
workspace) from XLA's buffer assignment (`memory_analysis`). The compiled
program's all-to-alls are counted. Nothing of the model's size is allocated.

    python benchmarks/memory_plan.py                       # both models, 8 / 32 / 64 devices
    python benchmarks/memory_plan.py --models switch_base_128 --devices 8 --output plan_base8
    python benchmarks/memory_plan.py --smoke
"""

import argparse
import json
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

# The gin job's expert-parallel run; each model's gin file is bound after it.
RUN_FILE = "runs/pretrain_c4_mesh.gin"
# HBM per chip (GiB) of the slices the table is checked against.
CHIPS = {"TPU v4": 32, "TPU v5e": 16}


def mesh_for(devices, num_experts):
    """All devices on the "expert" axis up to the expert count, the rest on "data"."""
    if isinstance(num_experts, (list, tuple)):  # per sparse layer
        num_experts = min(num_experts)
    expert = min(devices, num_experts)
    return {"data": devices // expert, "expert": expert, "model": 1}


def _bytes(shape, dtype):
    import numpy as np

    return int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize


def plan_one(gin_files, devices, batch_size, inputs_length, targets_length, bindings=()):
    """In a child with `devices` emulated CPU devices: the per-device sizes (bytes)."""
    import jax
    import keras
    import numpy as np

    from keras_moe import gin_config, models, sharding
    from keras_moe.training import schedules

    # "einsum": what dispatch="auto" becomes on TPU (CPU, where this runs, would pick "gather").
    config = gin_config.parse_gin(gin_files, ['T5Config.dispatch = "einsum"', *bindings],
                                  check_required=False)
    mesh = mesh_for(devices, config.num_experts)
    distribution = sharding.configure_mesh(mesh)
    # Variables created in this scope get a shape and a layout; initialize_variables=False
    # keeps them from being computed when it closes.
    with keras.StatelessScope(initialize_variables=False):
        model = models.build_model(config)
    optimizer = schedules.make_optimizer(name="adafactor", learning_rate=1.0,
                                         schedule="rsqrt", warmup_steps=10000)
    model.compile(**model.compile_defaults(optimizer=optimizer))
    for variable in model.variables:
        # What initialising the variable would do; the optimizer's slots take their
        # reference weight's layout from it (as in training).
        variable._layout = distribution.get_variable_layout(variable)
    # Adafactor creates some variables from values (not allowed in a StatelessScope)
    # and keeps a full-size second moment per weight: build it under eval_shape, so its
    # variables get shapes and layouts from traced, never computed, values.
    jax.eval_shape(lambda: optimizer.build(model.trainable_variables))

    def abstract(variables):
        out, total = [], 0
        for v in variables:
            layout = distribution.get_variable_layout(v)
            named = layout.backend_layout if layout is not None else None
            out.append(jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=named))
            local = named.shard_shape(v.shape) if named is not None else v.shape
            total += _bytes(local, v.dtype)
        return out, total

    trainable, param_bytes = abstract(model.trainable_variables)
    non_trainable, non_trainable_bytes = abstract(model.non_trainable_variables)
    optimizer_vars, optimizer_bytes = abstract(optimizer.variables)
    metrics_vars, _ = abstract(model.metrics_variables)

    def data(shape, dtype):
        layout = distribution.get_data_layout(shape)
        return jax.ShapeDtypeStruct(shape, dtype, sharding=layout.backend_layout)

    enc, dec = (batch_size, inputs_length), (batch_size, targets_length)
    inputs = {"encoder_input_tokens": data(enc, "int32"),
              "decoder_input_tokens": data(dec, "int32"),
              "encoder_segment_ids": data(enc, "int32"), "encoder_positions": data(enc, "int32"),
              "decoder_segment_ids": data(dec, "int32"), "decoder_positions": data(dec, "int32")}
    batch = (inputs, data(dec, "int32"), data(dec, "float32"))
    state = (trainable, non_trainable, optimizer_vars, metrics_vars)
    t0 = time.time()
    lowered = jax.jit(model.train_step, donate_argnums=0).lower(state, batch)
    compiled = lowered.compile()
    compile_s = time.time() - t0
    analysis = compiled.memory_analysis()
    hlo = compiled.as_text()
    num_params = sum(int(np.prod(v.shape)) for v in model.trainable_variables)
    return {
        "gin_files": gin_files, "devices": devices, "mesh": mesh, "parameters": num_params,
        "batch": [batch_size, inputs_length, targets_length],
        "vocab_size": config.vocab_size, "group_size": config.group_size,
        "param_bytes": param_bytes + non_trainable_bytes, "optimizer_bytes": optimizer_bytes,
        "temp_bytes": int(analysis.temp_size_in_bytes),
        "argument_bytes": int(analysis.argument_size_in_bytes),
        "output_bytes": int(analysis.output_size_in_bytes),
        "alias_bytes": int(analysis.alias_size_in_bytes),
        # "<shape> all-to-all(...)" is an instruction; "%all-to-all.3" a use of one.
        "all_to_all": hlo.count(" all-to-all("),
        "all_reduce": hlo.count(" all-reduce("),
        "all_gather": hlo.count(" all-gather("),
        "compile_seconds": round(compile_s, 1),
    }


def per_device_total(row):
    """Parameters + optimizer state + temporaries (the donated state is reused for outputs)."""
    return row["param_bytes"] + row["optimizer_bytes"] + row["temp_bytes"]


def fits(row):
    """{chip: fits in its HBM with 10 % left for the runtime}."""
    total = per_device_total(row)
    return {chip: total <= 0.9 * gib * 2 ** 30 for chip, gib in CHIPS.items()}


def markdown_table(rows):
    """The plan as the table in docs/sharding.md."""
    gib = 2 ** 30
    lines = ["| model | devices | mesh (data × expert) | parameters | optimizer | temporaries | "
             "total | all-to-all | fits " + " / ".join(f"{c} ({g} GiB)" for c, g in CHIPS.items())
             + " |", "|---|---|---|---|---|---|---|---|---|"]
    for row in rows:
        fit = " / ".join("yes" if ok else "no" for ok in fits(row).values())
        mesh = row["mesh"]
        lines.append(
            f"| {row['model']} ({row['parameters'] / 1e9:.1f}B) | {row['devices']} | "
            f"{mesh['data']} × {mesh['expert']} | {row['param_bytes'] / gib:.2f} GiB | "
            f"{row['optimizer_bytes'] / gib:.2f} GiB | {row['temp_bytes'] / gib:.2f} GiB | "
            f"{per_device_total(row) / gib:.2f} GiB | {row['all_to_all']} | {fit} |")
    return "\n".join(lines)


def _child(args):
    row = plan_one(args.gin_file, args.devices[0], args.batch_size, args.inputs_length,
                   args.targets_length, args.bindings or ())
    print("PLAN " + json.dumps(row), flush=True)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["switch_base_128", "switch_large_128"])
    parser.add_argument("--devices", nargs="+", type=int, default=[8, 32, 64])
    # pretrain_c4.gin: 256 packed sequences of 512 + 114 tokens.
    parser.add_argument("--batch_size", type=int, default=256)
    parser.add_argument("--inputs_length", type=int, default=512)
    parser.add_argument("--targets_length", type=int, default=114)
    parser.add_argument("--run_file", default=RUN_FILE)
    parser.add_argument("--bindings", action="append", help="gin bindings after the files")
    parser.add_argument("--timeout", type=int, default=3600)
    parser.add_argument("--smoke", action="store_true",
                        help="the tiny Switch model on 2 and 4 devices (seconds)")
    parser.add_argument("--output", default="memory_plan")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--gin_file", action="append", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        return _child(args)
    if args.smoke:
        args.run_file, args.models, args.devices = "runs/tiny_local.gin", ["switch_tiny"], [2, 4]
        args.batch_size, args.inputs_length, args.targets_length = 8, 32, 8
        args.bindings = ['T5Config.group_size = "sequence"']

    from benchmarks import common

    rows = []
    for name in args.models:
        for devices in args.devices:
            env = dict(os.environ, KERAS_BACKEND="jax", JAX_PLATFORMS="cpu",
                       TF_CPP_MIN_LOG_LEVEL="3",
                       XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}")
            gin_files = [args.run_file, f"models/{name}.gin"]
            command = [sys.executable, os.path.abspath(__file__), "--child", f"--devices={devices}",
                       *[f"--gin_file={f}" for f in gin_files],
                       f"--batch_size={args.batch_size}", f"--inputs_length={args.inputs_length}",
                       f"--targets_length={args.targets_length}",
                       *[f"--bindings={b}" for b in args.bindings or ()]]
            done = subprocess.run(command, env=env, capture_output=True, text=True,
                                  timeout=args.timeout, cwd=ROOT)
            lines = [l for l in done.stdout.splitlines() if l.startswith("PLAN ")]
            if done.returncode or not lines:
                raise RuntimeError(f"{name} on {devices} devices failed:\n{done.stderr[-3000:]}")
            row = json.loads(lines[-1][len("PLAN "):])
            row["fits"] = fits(row)
            row["model"] = name
            rows.append(row)
            gib = per_device_total(row) / 2 ** 30
            print(f"{name:18s} {devices:3d} devices {row['mesh']}: params "
                  f"{row['param_bytes'] / 2 ** 30:.2f} GiB, optimizer "
                  f"{row['optimizer_bytes'] / 2 ** 30:.2f}, temporaries "
                  f"{row['temp_bytes'] / 2 ** 30:.2f}, total {gib:.2f} GiB/device; "
                  f"{row['all_to_all']} all-to-all; compiled in {row['compile_seconds']} s",
                  flush=True)
    common.write_result(args.output, {"rows": rows, "chips_gib": CHIPS,
                                      "environment": common.environment()})
    print(markdown_table(rows))


if __name__ == "__main__":
    main()
