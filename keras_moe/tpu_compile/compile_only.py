"""Compile a gin job's train step for a TPU slice (or N emulated CPU devices) without one.

The TPU compiler (libtpu) runs on any Linux host: `jax.experimental.topologies`
describes a slice ("v5e:4x4") as compile-only devices, and a program lowered
over arguments sharded on them compiles exactly as it would on the slice. A
compile-only client cannot hold values, so the model, its optimizer and the
compiled metrics are built as shapes and layouts only (`keras.StatelessScope`
and `jax.eval_shape`), and one `model.train_step` is lowered over abstract
sharded arguments. The compiled program tells what the slice would see: the
per-chip argument / output / temporary bytes (XLA's buffer assignment), the
per-chip FLOPs, the collectives GSPMD inserted, and whether it fits HBM (the
TPU compiler raises RESOURCE_EXHAUSTED when it does not; that is reported as
`fits=False`, not raised).

    from keras_moe.tpu_compile.compile_only import compile_train_step
    report = compile_train_step(
        ["pretrain_c4_mesh.gin"], topology="v5e:4x4",
        bindings=['MeshPlacement.mesh_shape = {"data": 1, "expert": 16, "model": 1}'])

Set the environment before jax is imported (`setup_environment()`; the
`keras-moe-compile` CLI does it): KERAS_BACKEND=jax, JAX_PLATFORMS=cpu (the
host computes nothing; libtpu is loaded for its compiler only), and
TPU_SKIP_MDS_QUERY / TPU_WORKER_HOSTNAMES so libtpu does not look for a TPU VM's
metadata server.
"""

import re
import tempfile
import time

import keras
import numpy as np

from keras_moe.parallel import layouts, sharding, token_exchange
from keras_moe.parallel.abstract_arrays import abstract_batch as _abstract_batch
from keras_moe.parallel.token_exchange import format_exchange_choices  # noqa: F401
from keras_moe.tpu_compile import compile_memory, compile_progress, hlo_collectives, roofline
from keras_moe.tpu_compile.abstract_step import abstract_model as _abstract_model
from keras_moe.tpu_compile.abstract_step import abstract_state as _abstract_state
from keras_moe.tpu_compile.compile_job import (
    _job_batch,
    _job_dtype_policy,
    _job_mesh,
    _job_summary,
    _parse_job,
    job_config,
)
from keras_moe.tpu_compile.compile_report import format_report  # noqa: F401
from keras_moe.tpu_compile.tpu_topology import (  # noqa: F401  (this module's API before the split)
    GENERATIONS,
    KNOWN_TOPOLOGIES,
    canonical_topology,
    libtpu_missing_message,
    parse_topology,
    setup_environment,
    topology_devices,
)
from keras_moe.training.errors import CompileOnlyError
from keras_moe.training.placement.mesh import check_batch_splits

# "<shape> all-to-all(...)" is an instruction; "%all-to-all.3" a use of one.
COLLECTIVES = (
    "all-to-all",
    "ragged-all-to-all",
    "all-gather",
    "all-reduce",
    "reduce-scatter",
    "collective-permute",
)
GIB = 2**30


def cpu_devices(num):
    """`num` CPU devices; sets jax_num_cpu_devices if the CPU backend is not started yet."""
    import jax

    try:
        jax.config.update("jax_num_cpu_devices", int(num))
    except Exception:  # backend already initialised; check the count below
        pass
    devices = jax.devices("cpu")
    if len(devices) < num:
        raise CompileOnlyError(
            f"{num} CPU devices wanted but jax has {len(devices)}: call compile_train_step "
            f"before jax starts its CPU backend, or set XLA_FLAGS="
            f"--xla_force_host_platform_device_count={num} before importing jax."
        )
    return devices[:num]


def _count_collectives(hlo):
    return {name.replace("-", "_"): hlo.count(f" {name}(") for name in COLLECTIVES}


# "%dot.3 = bf16[8,64]{1,0:T(8,128)(2,1)} dot(...)": a matmul and its result type.
_MATMUL_RE = re.compile(r"= (\w+)\[[\d,]*\](?:\{[^}]*\})? (?:dot|convolution)\(")


def matmul_dtypes(hlo):
    """{element type: count} of the matmuls (dot, convolution) in an HLO text.

    Args:
        hlo: the text of an HLO module (`lowered.as_text(dialect="hlo")`).

    Example:
    >>> matmul_dtypes("%d = bf16[8,64]{1,0} dot(%a, %b)\\n%e = f32[8,4]{1,0} dot(%c, %k)")
    {'bf16': 1, 'f32': 1}
    """
    counts = {}
    for dtype in _MATMUL_RE.findall(hlo):
        counts[dtype] = counts.get(dtype, 0) + 1
    return dict(sorted(counts.items()))


def _cost(compiled):
    try:
        cost = compiled.cost_analysis()
    except Exception:  # not every backend has one
        return {}
    if isinstance(cost, (list, tuple)):
        cost = cost[0] if cost else {}
    return dict(cost or {})


def compile_train_step(
    gin_files,
    bindings=(),
    topology=None,
    num_cpu_devices=None,
    mesh_shape=None,
    batch_size=None,
    feature_lengths=None,
    allowed_imports=(),
    target_platform=None,
    dtype_policy=None,
    progress=None,
):
    """Compiles one train step of the gin job and reports its per-chip cost.

    Args:
        gin_files: the job's gin files (names or paths, as `keras-moe-train`).
        bindings: gin bindings applied after the files.
        topology: a TPU slice, e.g. "v5e:4x4" (needs libtpu); None: CPU devices.
        num_cpu_devices: without a topology, the number of emulated CPU devices
            (default: the mesh's size, else 1).
        mesh_shape: dict axis -> size; default the job's `MeshPlacement.mesh_shape`; or a
            callable `(num_devices, t5_config) -> dict`.
        batch_size: global batch; default the job's `train.batch_size`.
        feature_lengths: {"inputs": n, "targets": m}; default the job's
            `train.feature_lengths`.
        allowed_imports: modules gin `import` lines may name (as --gin_allow_import).
        target_platform: whose `dispatch="auto"` choice to compile: "tpu"
            (default with a topology: einsum) or "cpu" (the host's own choice).
        dtype_policy: Keras dtype policy the model is built under, as
            `train(dtype_policy=...)`; default the job's `train.dtype_policy`
            (`train.dtype_policy`), float32 when unbound.
        progress: a `compile_progress.CompileProgress` told each stage (and
            beating while the compiler runs); default silent.

    Returns:
        a dict: topology, chips, device_kind, mesh, parameters, batch, dispatch,
        dtype_policy, `compute_dtype` (the model's), `matmul_dtypes` (result
        types of the train step's matmuls as lowered, before the compiler's
        precision choices; `matmul_dtypes()`),
        per-chip bytes (`param_bytes` (trainable), `non_trainable_bytes`,
        `optimizer_bytes`, `metrics_bytes` from the shard shapes;
        `argument_bytes`, `output_bytes`, `alias_bytes`, `temp_bytes` from the
        compiler's memory_analysis), `peak_bytes` (on TPU the compiler's
        peak_memory_in_bytes, else arguments + temporaries + outputs - aliases,
        also given as `computed_peak_bytes`; `peak_source` says which), `hbm_bytes` (per chip of
        the TPU generation, None on CPU), `fits` (None on CPU without a
        topology), `error` (the compiler's RESOURCE_EXHAUSTED message when it
        does not fit), `flops_per_chip` (cost_analysis of the partitioned
        program: one chip's FLOPs per step), `collectives` (instruction counts
        in the compiled HLO), `moe_exchange` (how each MoE layer moves its
        expert buffers and why: `keras_moe.parallel.token_exchange.exchange_choices`),
        `activation_all_gathers` (count, bytes received per chip and the
        largest of the all-gathers not shaped like a weight:
        `hlo_collectives.activation_all_gathers`), `largest_allocations` (TPU:
        the biggest HBM buffers of the compiler's buffer assignment, also when
        it ran out of memory: `compile_memory`), `sparse_ffn_classes`,
        `compile_seconds`.

    Raises:
        CompileOnlyError: unknown topology, missing libtpu, train.mesh_shape whose
            product is not the chip count, no model in the gin files, ...
        keras_moe.gin_config.errors.GinConfigError: bad gin files or bindings.
    """

    progress = progress or compile_progress.SILENT
    topology = None if topology is None else canonical_topology(topology)
    _check_jax_backend()
    generation, hbm, devices = _topology_target(topology, progress)
    if target_platform is None:
        target_platform = "tpu" if topology is not None else sharding.accelerator_platform()
    progress.stage("reading the gin job")
    files, bindings, config = _parse_job(gin_files, bindings, allowed_imports, target_platform)
    job = job_config()
    dtype_policy = _job_dtype_policy(dtype_policy, job)
    batch_size_given = batch_size
    batch_size, feature_lengths = _job_batch(batch_size, feature_lengths, job)
    job_mesh, job_rules = _job_mesh(job)
    from keras_moe.training import train_configurables

    if devices is None:
        devices = cpu_devices(_num_cpu_devices(num_cpu_devices, mesh_shape, job_mesh))
    mesh_shape = _checked_mesh_shape(mesh_shape, devices, config, topology, job_mesh)
    check_batch_splits(
        dict(mesh_shape),
        job_rules,
        batch_size,
        "BATCH_SIZE" if batch_size_given is None else "--batch_size",
    )
    distribution = _configure_mesh(config, devices, mesh_shape, job_rules)
    try:
        report = _compile(
            config,
            distribution,
            train_configurables,
            batch_size,
            feature_lengths,
            on_tpu=topology is not None,
            dtype_policy=dtype_policy,
            progress=progress,
            where=_where(topology, devices),
        )
    finally:
        sharding.clear_mesh()
    report.update(gin_files=files, bindings=bindings, topology=topology, generation=generation)
    report.update(
        _job_summary(config, devices, distribution, batch_size, feature_lengths, target_platform)
    )
    report.update(target_platform=target_platform, hbm_bytes=hbm, fits=_fits(report, hbm))
    report["roofline"] = roofline.estimate(
        report["flops_per_chip"],
        report.get("bytes_accessed_per_chip"),
        report.get("collective_bytes_per_chip") or {},
        generation,
        report.get("model_flops_per_chip"),
    )
    return report


def _check_jax_backend():
    """Raises CompileOnlyError unless Keras runs the JAX backend."""

    if keras.backend.backend() != "jax":
        raise CompileOnlyError(
            "compile_train_step needs KERAS_BACKEND=jax (set it before "
            "keras is imported; see setup_environment())."
        )


def _topology_target(topology, progress):
    """`(generation, HBM bytes per chip, compile-only devices)` of a TPU topology, or Nones."""
    if topology is None:
        return None, None, None
    generation = parse_topology(topology)[0]
    progress.stage(f"loading the TPU compiler (libtpu) for {topology}")
    with progress.quiet():  # libtpu's start-up lines about the TPU this host lacks
        devices = topology_devices(topology)
    return generation, GENERATIONS[generation]["hbm_gib"] * GIB, devices


def _where(topology, devices):
    if topology is None:
        return f"{len(devices)} emulated CPU devices with XLA:CPU"
    return f"{len(devices)} chips of {topology} with the TPU compiler"


def _num_cpu_devices(num_cpu_devices, mesh_shape, job_mesh):
    """`num_cpu_devices`, else the size of `mesh_shape` (a dict) or of `job_mesh`, else 1."""

    if num_cpu_devices is not None:
        return num_cpu_devices
    shape = mesh_shape if isinstance(mesh_shape, dict) else job_mesh
    return int(np.prod(list(shape.values()))) if shape else 1


def _checked_mesh_shape(mesh_shape, devices, config, topology, job_mesh):
    """The mesh shape to compile over (argument, job's, else all "data"), checked on `devices`."""

    if callable(mesh_shape):
        mesh_shape = mesh_shape(len(devices), config)
    if mesh_shape is None:
        mesh_shape = job_mesh
    if mesh_shape is None:
        mesh_shape = {"data": len(devices)}
    size = int(np.prod([int(v) for v in dict(mesh_shape).values()]))
    if size != len(devices):
        where = f"the topology {topology}" if topology else "the emulated CPU devices"
        raise CompileOnlyError(
            f"the mesh {dict(mesh_shape)!r} has {size} devices but {where} has "
            f"{len(devices)}: the product of its sizes must equal the chip count (e.g. "
            f'--gin_bindings=\'MeshPlacement.mesh_shape = {{"data": 1, "expert": '
            f'{len(devices)}, "model": 1}}\', or the shorthand train.mesh_shape where the '
            "job binds no placement)."
        )
    return mesh_shape


def _configure_mesh(config, devices, mesh_shape, rules):
    """Sets the mesh over `devices` with the job's logical axis `rules` (None: the
    defaults); the distribution."""

    rules = layouts.DEFAULT_RULES if rules is None else rules
    num_experts = config.num_experts
    if isinstance(num_experts, (list, tuple)):
        num_experts = min(num_experts)
    try:
        return sharding.configure_mesh(mesh_shape, rules, devices=devices, num_experts=num_experts)
    except ValueError as e:
        raise CompileOnlyError(f"mesh_shape={dict(mesh_shape)!r}: {e}") from None


def _fits(report, hbm):
    """False when the compiler ran out of memory, else whether the peak fits (None: no HBM)."""
    if report["error"] is not None:
        return False
    if hbm is not None:
        return report["peak_bytes"] <= hbm
    return None


def _compile(
    config,
    distribution,
    train_configurables,
    batch_size,
    feature_lengths,
    on_tpu,
    dtype_policy="float32",
    progress=compile_progress.SILENT,
    where="",
):
    """Lowers and compiles one train step over abstract sharded arguments; its report."""
    import jax

    progress.stage("building the abstract model and optimizer (shapes and layouts, no values)")
    model, optimizer = _abstract_model(config, distribution, train_configurables, dtype_policy)
    state, state_bytes = _abstract_state(model, optimizer, distribution)
    batch = _abstract_batch(distribution, batch_size, feature_lengths)
    report = {
        "parameters": int(sum(int(np.prod(v.shape)) for v in model.trainable_variables)),
        "param_dtype": str(model.trainable_variables[0].dtype),
        "dtype_policy": dtype_policy,
        "compute_dtype": model.compute_dtype,
        "matmul_dtypes": None,
        **state_bytes,
        "error": None,
        "moe_exchange": None,
        "largest_allocations": None,
    }
    t0 = time.time()
    token_exchange.clear_exchange_choices()
    progress.stage(f"lowering the train step ({report['parameters'] / 1e6:.1f}M parameters)")
    # The state is donated, as Keras' JAX trainer does: its outputs reuse it.
    lowered = jax.jit(model.train_step, donate_argnums=0).lower(state, batch)
    report["moe_exchange"] = token_exchange.exchange_choices()
    # As written, before the compiler's own precision choices (the TPU's
    # default precision runs float32 matmuls as bfloat16 passes either way).
    report["matmul_dtypes"] = matmul_dtypes(lowered.as_text(dialect="hlo"))
    progress.stage(
        f"compiling for {where} ({compile_progress.EXPECTED_COMPILE_TIME}; "
        f"a line every {progress.heartbeat_seconds:g} s while it runs)"
    )
    # On TPU the compiler's buffer assignment (written to the dump, also when it
    # runs out of memory) names the largest buffers.
    with tempfile.TemporaryDirectory(prefix="keras_moe_compile_") as dump:
        options = {"xla_dump_to": dump} if on_tpu else None
        try:
            with progress.heartbeat("compiling"):
                compiled = lowered.compile(compiler_options=options)
        except Exception as e:  # jax.errors.JaxRuntimeError
            if "RESOURCE_EXHAUSTED" not in str(e):
                raise
            compiled = None
            report.update(compile_memory.out_of_memory_entries(str(e), time.time() - t0))
        report["largest_allocations"] = compile_memory.largest_allocations(dump)
    seconds = compile_progress.format_duration(time.time() - t0)
    if compiled is None:
        progress.stage(f"out of memory after {seconds}")
        return report
    progress.stage(f"compiled in {seconds}")
    report["compile_seconds"] = round(time.time() - t0, 1)
    report.update(compile_memory.memory_entries(compiled, on_tpu))
    cost = _cost(compiled)
    report["flops_per_chip"] = float(cost["flops"]) if "flops" in cost else None
    report["bytes_accessed_per_chip"] = (
        float(cost["bytes accessed"]) if "bytes accessed" in cost else None
    )
    hlo = compiled.as_text()
    chips = len(distribution.device_mesh.devices.flat)
    report["collectives"] = _count_collectives(hlo)
    report["collective_bytes_per_chip"] = roofline.collective_bytes(hlo, chips)
    weights = [(a.shape, a.sharding.shard_shape(a.shape)) for part in state for a in part]
    gathers = hlo_collectives.activation_all_gathers(hlo, weights, chips)
    report["activation_all_gathers"] = {
        "count": len(gathers),
        "received_bytes": sum(c.received_bytes for c in gathers),
        "largest": [
            {"dims": list(c.dims), "op_name": c.op_name}
            for c in sorted(gathers, key=lambda c: -c.result_bytes)[:3]
        ],
    }
    report["model_flops_per_chip"] = (
        roofline.model_flops_per_step(
            model, batch_size, feature_lengths["inputs"], feature_lengths["targets"]
        )
        / chips
    )
    return report
