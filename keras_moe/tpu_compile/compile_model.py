"""Compile one `fit` train step of any Keras model for a TPU slice, without a TPU or its weights.

`compile_model_train_step(build_model, batch, topology="v5p:4x4x4", mesh_shape=...)`
builds the model as shapes and layouts only (no weight is allocated: a 30B-parameter
model compiles on a laptop), lowers Keras' own JAX `train_step` over sharded abstract
arguments and compiles it with the TPU compiler (libtpu), as `compile_train_step` does
for gin jobs. The report says whether the step fits the chips' HBM, its FLOPs, its
collectives, how many all-gathers return a whole (or partly gathered) expert weight,
and the roofline bound of the step.

Set the environment first (`keras_moe.tpu_compile.tpu_topology.setup_environment()`,
before keras is imported): KERAS_BACKEND=jax, JAX_PLATFORMS=cpu.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from typing import Any

import keras
import numpy as np

from keras_moe import compat
from keras_moe.parallel import sharding
from keras_moe.parallel.abstract_arrays import abstract_array
from keras_moe.tpu_compile import compile_memory, compile_progress, hlo_collectives, roofline
from keras_moe.tpu_compile.abstract_step import abstract_state
from keras_moe.tpu_compile.compile_only import (
    _check_jax_backend,
    _cost,
    _count_collectives,
    _fits,
    _topology_target,
    cpu_devices,
)
from keras_moe.tpu_compile.tpu_topology import canonical_topology
from keras_moe.training.errors import CompileOnlyError
from keras_moe.training.run.dtype_policy import dtype_policy_scope

# Variable paths of expert weights: keras_moe's experts and keras-hub's dense expert banks.
EXPERT_WEIGHT = re.compile(
    r".*experts/(wi(_0|_1)?|wo|b(i(_0|_1)?|o))$"
    r"|.*experts/(_?expert_feedforward\w*|gate_up_proj\w*|down_proj\w*)$"
)


def _abstract_data(batch, distribution):
    import jax

    def leaf(spec):
        shape, dtype = spec
        shape = tuple(int(n) for n in shape)
        return abstract_array(
            shape, dtype, distribution.device_mesh, distribution.get_data_layout(shape)
        )

    return jax.tree_util.tree_map(
        leaf,
        batch,
        is_leaf=lambda x: isinstance(x, tuple) and len(x) == 2 and isinstance(x[1], str),
    )


def _build_abstract(build_model, distribution, dtype_policy, compile_args):
    """The model and its optimizer with shapes and layouts only: built inside
    `jax.eval_shape`, every variable's value is a tracer, never an array."""
    import jax

    built = {}

    def build():
        with dtype_policy_scope(dtype_policy):
            built["model"] = model = build_model()
        if not isinstance(model, keras.Model):
            raise CompileOnlyError(
                f"`build_model` must return a keras.Model, got {type(model).__name__}."
            )
        if compile_args is not None:
            model.compile(**compile_args)
        if getattr(model, "optimizer", None) is None:
            raise CompileOnlyError("the model is not compiled: give `compile_args`.")
        model.optimizer.build(model.trainable_variables)

    jax.eval_shape(build)
    model = built["model"]
    for variable in model.variables:
        compat.set_variable_layout(variable, distribution.get_variable_layout(variable))
    return model


def compile_model_train_step(
    build_model: Callable[[], Any],
    batch: Any,
    topology: str | None = None,
    num_cpu_devices: int | None = None,
    mesh_shape: dict[str, int] | None = None,
    dtype_policy: str = "float32",
    compile_args: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Compiles one train step of `build_model()`'s model over a device mesh; its report.

    Args:
        build_model: makes the model (and may `compile` it). It is called under
            the mesh inside `jax.eval_shape`, where variables get a shape and a
            traced value, never an array: build from a config, not a checkpoint
            (`keras_moe.sparsify` works there, moving no values).
        batch: one step's data `(x, y)` or `(x, y, sample_weight)`, each leaf
            a `(global shape, dtype name)` pair, e.g.
            `({"token_ids": ((64, 4096), "int32"), ...}, ((64, 4096), "int32"))`.
        topology: a TPU slice such as "v5p:4x4x4" (needs libtpu: the `tpu`
            extra); None: emulated CPU devices.
        num_cpu_devices: without a topology, how many CPU devices (default:
            the mesh's size).
        mesh_shape: `{"data": d, "expert": e, "model": m}`, product = chips
            (default: all "data").
        dtype_policy: the Keras dtype policy the model is built under.
        compile_args: `model.compile` arguments (None: the model as
            `build_model` compiled it, e.g. a keras-hub task's defaults).

    Returns:
        a dict: chips, mesh, parameters, per-chip bytes (`param_bytes`,
        `optimizer_bytes`, ..., `peak_bytes`), `hbm_bytes`, `fits`,
        `flops_per_chip`, `collectives` (counts), `expert_weight_all_gathers`
        (all-gathers whose result is shaped like an expert weight or a part
        of one), `roofline` (TPU: `roofline.estimate`), `compile_seconds`,
        `error` (the compiler's out-of-memory message, else None).
    """
    import jax

    _check_jax_backend()
    topology = None if topology is None else canonical_topology(topology)

    generation, hbm, devices = _topology_target(topology, compile_progress.SILENT)
    if devices is None:
        size = int(np.prod(list(mesh_shape.values()))) if mesh_shape else 1
        devices = cpu_devices(num_cpu_devices or size)
    mesh_shape = dict(mesh_shape or {"data": len(devices)})
    if int(np.prod(list(mesh_shape.values()))) != len(devices):
        raise CompileOnlyError(
            f"`mesh_shape` {mesh_shape} does not have the {len(devices)} "
            "devices of the target: the product of its sizes must equal it."
        )
    distribution = sharding.configure_mesh(mesh_shape, devices=devices)
    try:
        model = _build_abstract(build_model, distribution, dtype_policy, compile_args)
        state, sizes = abstract_state(model, model.optimizer, distribution)
        data = _abstract_data(batch, distribution)
        report = {
            "chips": len(devices),
            "mesh": mesh_shape,
            "topology": topology,
            "parameters": int(sum(int(np.prod(v.shape)) for v in model.trainable_variables)),
            **sizes,
            "hbm_bytes": hbm,
            "error": None,
        }
        start = time.time()
        lowered = jax.jit(model.train_step, donate_argnums=0).lower(state, data)
        try:
            compiled = lowered.compile()
        except Exception as e:  # jax.errors.JaxRuntimeError
            if "RESOURCE_EXHAUSTED" not in str(e):
                raise
            report.update(compile_memory.out_of_memory_entries(str(e), time.time() - start))
            report["fits"] = False
            return report
    finally:
        sharding.clear_mesh()
    report["compile_seconds"] = round(time.time() - start, 1)
    report.update(compile_memory.memory_entries(compiled, topology is not None))
    report["fits"] = _fits(report, hbm)
    cost = _cost(compiled)
    report["flops_per_chip"] = float(cost["flops"]) if "flops" in cost else None
    report["bytes_accessed_per_chip"] = (
        float(cost["bytes accessed"]) if "bytes accessed" in cost else None
    )
    hlo = compiled.as_text()
    report["collectives"] = _count_collectives(hlo)
    report["collective_bytes_per_chip"] = roofline.collective_bytes(hlo, len(devices))
    experts = [
        (tuple(v.shape), distribution.get_variable_layout(v))
        for v in model.variables
        if EXPERT_WEIGHT.match(v.path)
    ]
    shapes = [
        (
            full,
            abstract_array(full, "float32", distribution.device_mesh, layout).sharding.shard_shape(
                full
            ),
        )
        for full, layout in experts
    ]
    report["expert_weights"] = len(experts)
    report["expert_weight_all_gathers"] = sum(
        1
        for c in hlo_collectives.collectives(hlo, len(devices))
        if c.kind == "all-gather" and hlo_collectives.is_weight_shape(c.dims, shapes)
    )
    if generation is not None:
        report["roofline"] = roofline.estimate(
            report["flops_per_chip"],
            report["bytes_accessed_per_chip"],
            report["collective_bytes_per_chip"] or {},
            generation,
        )
    return report
