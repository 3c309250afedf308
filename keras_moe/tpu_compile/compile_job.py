"""The gin job as `keras-moe-compile` reads it: the model's `T5Config` (its dispatch as
the target platform picks it), the job's mesh, batch, feature lengths and dtype
policy from its `TrainConfig`, and the report's summary of them.
"""

import os

from keras_moe import gin_config
from keras_moe.dispatch import resolve_dispatch
from keras_moe.training.errors import CompileOnlyError, TrainingConfigError
from keras_moe.training.placement import MeshPlacement
from keras_moe.training.run.dtype_policy import check_dtype_policy


def job_config():
    """The job's `TrainConfig` (`train_configurables.job_config`): its dataset,
    placement and dtype policy; gin's errors become `CompileOnlyError`."""
    from keras_moe.training import train_configurables

    try:
        return train_configurables.job_config()
    except (ValueError, TypeError, RuntimeError) as e:
        raise CompileOnlyError(f"the gin job's train settings: {e}") from None


def _job_mesh(config):
    """`(mesh shape, logical axis rules)` of the job's placement; `(None, None)` without a mesh."""
    if isinstance(config.placement, MeshPlacement):
        return config.placement.mesh_shape, config.placement.logical_axis_rules
    return None, None


def _job_dtype_policy(dtype_policy, job):
    """`dtype_policy`, else the job's `train.dtype_policy` (float32 when unbound), checked."""
    if dtype_policy is None:
        dtype_policy = job.dtype_policy
    try:
        return check_dtype_policy(dtype_policy)
    except TrainingConfigError as e:
        raise CompileOnlyError(str(e)) from None


def _dispatch_binding(config, target_platform):
    """The binding that makes the model dispatch as `target_platform` would, or None."""
    mode = config.sparse_option("dispatch")
    if target_platform != "tpu":
        return None
    # "dropless" compiles as written: under the TPU mesh grouped_matmul runs
    # the megablox kernel (keras_moe.dispatch.grouped_matmul).
    # keras_moe.dispatch.get_dispatcher: "auto" is einsum on TPU. On this host
    # "auto" would see the CPU and pick gather, so the TPU program is pinned.
    if mode != "auto":
        return None
    # Bound on the specs' layer classes, by name (e.g. `SwitchFeedForward`).
    names = sorted({spec["class_name"].split(">")[-1] for spec in config.used_sparse_ffn_specs()})
    return "\n".join(f'{name}.dispatch = "einsum"' for name in names)


def _parse_job(gin_files, bindings, allowed_imports, target_platform):
    """`(files, bindings, T5Config)` of the gin job, its dispatch as `target_platform` picks it."""
    files = [gin_files] if isinstance(gin_files, (str, os.PathLike)) else list(gin_files)
    bindings = [bindings] if isinstance(bindings, str) else list(bindings or ())
    config = gin_config.parse_gin(
        files, bindings, allowed_imports=allowed_imports, check_required=False
    )
    if config is None:
        raise CompileOnlyError(f"the gin files {files} bind no model (build_model.config).")
    extra = _dispatch_binding(config, target_platform)
    if extra:
        bindings = bindings + [extra]
        config = gin_config.parse_gin(
            files, bindings, allowed_imports=allowed_imports, check_required=False
        )
    return files, bindings, config


def _job_batch(batch_size, feature_lengths, job):
    """`batch_size` and `feature_lengths`, else the job's; raises when neither gives them."""
    dataset = job.dataset
    if batch_size is None and dataset is not None:
        batch_size = dataset.batch_size
    if feature_lengths is None and dataset is not None:
        feature_lengths = dataset.feature_lengths
    if not batch_size or not feature_lengths:
        raise CompileOnlyError(
            "the gin job binds no BATCH_SIZE / TASK_FEATURE_LENGTHS: "
            "bind them or pass batch_size= and feature_lengths=."
        )
    return batch_size, feature_lengths


def _job_summary(config, devices, distribution, batch_size, feature_lengths, target_platform):
    """The report's entries on the devices, the mesh, the batch and the model's MoE settings."""
    device_mesh = distribution.device_mesh
    mesh = dict(zip(device_mesh.axis_names, device_mesh.shape, strict=False))
    batch = {"batch_size": int(batch_size), **{k: int(v) for k, v in dict(feature_lengths).items()}}
    return {
        "chips": len(devices),
        "device_kind": devices[0].device_kind,
        "mesh": mesh,
        "batch": batch,
        "dispatch": resolve_dispatch(config.sparse_option("dispatch"), target_platform),
        "num_experts": config.num_experts,
        "vocab_size": config.vocab_size,
        "group_size": config.sparse_option("group_size"),
        "sparse_ffn_classes": sorted(
            {spec["class_name"].split(">")[-1] for spec in config.used_sparse_ffn_specs()}
        ),
    }
