"""`T5Config`'s flat MoE fields from before the sparse-FFN spec (`moe_type`,
`num_experts`, ...), which old checkpoints' configs and gin files hold, and the
spec they make.
"""

from typing import Any, Dict, Optional

# T5Config's MoE fields before the spec, and their defaults then: old
# checkpoints' configs hold these (see `spec_from_flat_fields`).
FLAT_FIELDS = dict(
    moe_type=None,
    num_experts=0,
    expert_d_ff=None,
    expert_activation=None,
    train_capacity_factor=1.25,
    eval_capacity_factor=2.0,
    min_expert_capacity=4,
    group_size="batch",
    jitter_noise=0.0,
    expert_dropout_rate=0.0,
    router_init_scale=None,
    aux_loss_factor=1e-2,
    z_loss_factor=1e-3,
    dispatch="auto",
    router_bias=False,
    router_dtype="float32",
)


def spec_from_flat_fields(values: Dict[str, Any]) -> Optional[Dict[str, Any]]:
    """The spec of a config saved with the old flat MoE fields (which are removed
    from `values`), or None for a dense one. Reads the fields; builds no layer.

    Args:
        values: a `T5Config.to_dict()` of a checkpoint from before the spec.
    """
    flat = {name: values.pop(name, default) for name, default in FLAT_FIELDS.items()}
    if flat["moe_type"] is None:
        return None
    class_name = {
        "switch": "keras_moe>SwitchFeedForward",
        "gshard": "keras_moe>GShardFeedForward",
    }.get(flat["moe_type"])
    if class_name is None:
        raise ValueError(
            f"`moe_type` must be None, 'switch' or 'gshard', got {flat['moe_type']!r}."
        )
    config = dict(
        num_experts=flat["num_experts"],
        d_ff=flat["expert_d_ff"] or values.get("d_ff", 2048),
        activation=flat["expert_activation"] or values.get("activation", "gated-gelu"),
        init_scale=values.get("init_scale", 1.0),
        **{
            name: flat[name]
            for name in (
                "train_capacity_factor",
                "eval_capacity_factor",
                "min_expert_capacity",
                "group_size",
                "jitter_noise",
                "expert_dropout_rate",
                "router_init_scale",
                "aux_loss_factor",
                "z_loss_factor",
                "dispatch",
                "router_bias",
                "router_dtype",
            )
        },
    )
    return {"class_name": class_name, "config": config}
