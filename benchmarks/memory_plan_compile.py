"""One compile of the gin job's train step for memory_plan.py (run in its child process)."""


def mesh_for(devices, num_experts):
    """All devices on the "expert" axis up to the expert count, the rest on "data"."""
    if isinstance(num_experts, (list, tuple)):  # per sparse layer
        num_experts = min(num_experts)
    if not num_experts:  # a dense model: every device on "data"
        return {"data": devices, "expert": 1, "model": 1}
    expert = min(devices, num_experts)
    return {"data": devices // expert, "expert": expert, "model": 1}


def plan_one(
    gin_files,
    devices=None,
    batch_size=None,
    inputs_length=None,
    targets_length=None,
    bindings=(),
    topology=None,
    dtype_policy=None,
):
    """The per-device sizes (bytes) of one compile: `devices` emulated CPU devices
    (set before jax starts) or the chips of a TPU `topology`; all of them on the
    "expert" axis up to the expert count (`mesh_for`); the program a TPU would run
    (dispatch "auto" is einsum) on CPU devices too; the model under `dtype_policy`
    (default the job's train.dtype_policy)."""
    from keras_moe.tpu_compile import compile_only

    feature_lengths = None
    if inputs_length or targets_length:
        feature_lengths = {"inputs": inputs_length, "targets": targets_length}
    report = compile_only.compile_train_step(
        gin_files,
        bindings,
        topology=topology,
        num_cpu_devices=None if topology else devices,
        mesh_shape=lambda n, config: mesh_for(n, config.num_experts),
        batch_size=batch_size,
        feature_lengths=feature_lengths,
        target_platform="tpu",  # dispatch "auto" as on TPU (einsum), on CPU devices too
        dtype_policy=dtype_policy,
    )
    batch = report["batch"]
    collectives = report["collectives"] or {}
    return {
        "gin_files": report["gin_files"],
        "devices": report["chips"],
        "topology": topology,
        "device_kind": report["device_kind"],
        "mesh": report["mesh"],
        "parameters": report["parameters"],
        "batch": [batch["batch_size"], batch["inputs"], batch["targets"]],
        "vocab_size": report["vocab_size"],
        "group_size": report["group_size"],
        "dispatch": report["dispatch"],
        "param_dtype": report["param_dtype"],
        "dtype_policy": report["dtype_policy"],
        "compute_dtype": report["compute_dtype"],
        "matmul_dtypes": report["matmul_dtypes"],
        "param_bytes": report["param_bytes"] + report["non_trainable_bytes"],
        "optimizer_bytes": report["optimizer_bytes"],
        "temp_bytes": report["temp_bytes"],
        "argument_bytes": report["argument_bytes"],
        "output_bytes": report["output_bytes"],
        "alias_bytes": report["alias_bytes"],
        "peak_bytes": report["peak_bytes"],
        "peak_source": report["peak_source"],
        "hbm_bytes": report["hbm_bytes"],
        "compiler_fits": report["fits"],
        "error": report["error"],
        "flops_per_chip": report["flops_per_chip"],
        "all_to_all": collectives.get("all_to_all"),
        "all_reduce": collectives.get("all_reduce"),
        "all_gather": collectives.get("all_gather"),
        "collectives": report["collectives"],
        "compile_seconds": report["compile_seconds"],
        "bytes_accessed_per_chip": report.get("bytes_accessed_per_chip"),
        "collective_bytes_per_chip": report.get("collective_bytes_per_chip"),
        "model_flops_per_chip": report.get("model_flops_per_chip"),
        "roofline": report.get("roofline"),
    }
