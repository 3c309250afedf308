"""How each keras-hub MoE family's block maps onto keras_moe's router, experts and
shared expert: which attribute of a decoder layer holds the block, the router's
scoring, and where each weight lives.

A `Family` reads a keras-hub block (`read_block`) into a `BlockWeights`: the
arguments and the weight values of a `TopKRouter`, a `FeedForwardExperts` and
an optional `SharedExpertFeedForward`. Nothing here builds a layer.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from keras import ops


@dataclasses.dataclass
class BlockWeights:
    """What a keras-hub MoE block holds, in keras_moe's terms.

    `router_args`, `experts_args`, `shared_args`: constructor arguments of
    `TopKRouter`, `FeedForwardExperts`, `SharedExpertFeedForward` (None: no
    shared expert); `router`, `experts`, `shared`: weight values by keras_moe
    weight name; `aux_loss_factor`: the block's load-balancing coefficient.
    """

    router_args: dict[str, Any]
    experts_args: dict[str, Any]
    router: dict[str, Any]
    experts: dict[str, Any]
    aux_loss_factor: float
    shared_args: dict[str, Any] | None = None
    shared: dict[str, Any] | None = None


@dataclasses.dataclass(frozen=True)
class Family:
    """One keras-hub MoE family.

    Attributes:
        name: keras-hub's model prefix ("Qwen3Moe").
        module: the keras-hub module of its decoder layer.
        block_class: name of its MoE block class in `module`.
        block_attribute: the decoder layer's attribute holding the block.
        read_block: block -> `BlockWeights`.
    """

    name: str
    module: str
    block_class: str
    block_attribute: str
    read_block: Callable[[Any], BlockWeights]


def _value(variable):
    """The variable's value as NumPy, or None for one made without an array (a model
    of shapes only, to compile it: its values are None in a
    `keras.StatelessScope(initialize_variables=False)`, JAX tracers in `jax.eval_shape`)."""
    value = getattr(variable, "_value", None)
    if value is None or type(value).__name__.endswith("Tracer"):
        return None
    return ops.convert_to_numpy(variable)


def _halves(gate_up):
    """`[..., 2f]` fused gate/up (gate first) -> (gate, up)."""
    if gate_up is None:
        return None, None
    f = gate_up.shape[-1] // 2
    return gate_up[..., :f], gate_up[..., f:]


def _interleaved(gate_up):
    """`[..., 2f]` gate and up interleaved (gpt-oss) -> (gate, up)."""
    if gate_up is None:
        return None, None
    return gate_up[..., ::2], gate_up[..., 1::2]


def _read_mixtral(block) -> BlockWeights:
    bank = block.expert_bank
    return BlockWeights(
        router_args=dict(
            num_experts=block.num_experts,
            k=block.top_k,
            normalize_top_k=True,
            jitter_noise=float(block.router_jitter_noise),
        ),
        experts_args=dict(
            num_experts=block.num_experts, d_ff=block.intermediate_dim, activation="gated-silu"
        ),
        router=dict(kernel=_value(block._sparse_feedforward_gate_dense.kernel)),
        experts=dict(
            wi_0=_value(bank._expert_feedforward_gate_dense),
            wi_1=_value(bank._expert_feedforward_intermediate_dense),
            wo=_value(bank._expert_feedforward_output_dense),
        ),
        aux_loss_factor=float(block.router_aux_loss_coef),
    )


def _read_qwen3(block) -> BlockWeights:
    bank = block.expert_bank
    gate, up = _halves(_value(bank._expert_feedforward_gate_dense))
    return BlockWeights(
        router_args=dict(
            num_experts=block.num_experts,
            k=block.top_k,
            normalize_top_k=bool(block.norm_top_k_prob),
        ),
        experts_args=dict(
            num_experts=block.num_experts, d_ff=block.intermediate_dim, activation="gated-silu"
        ),
        router=dict(kernel=_value(block._sparse_feedforward_gate_dense.kernel)),
        experts=dict(wi_0=gate, wi_1=up, wo=_value(bank._expert_feedforward_output_dense)),
        aux_loss_factor=float(block.router_aux_loss_coefficient),
    )


def _read_qwen(block) -> BlockWeights:
    weights = _read_qwen3(block)
    mlp = block.shared_expert_dense
    weights.shared_args = dict(
        d_ff=block.intermediate_dim_shared, activation="gated-silu", gate=True
    )
    weights.shared = dict(
        wi_0=_value(mlp._feedforward_gate_dense.kernel),
        wi_1=_value(mlp._feedforward_intermediate_dense.kernel),
        wo=_value(mlp._feedforward_output_dense.kernel),
        gate_kernel=_value(block.shared_expert_gate_dense.kernel),
    )
    return weights


def _read_gpt_oss(block) -> BlockWeights:
    experts = block.experts
    gate, up = _interleaved(_value(experts.gate_up_proj))  # [E, d, 2f]
    gate_bias, up_bias = _interleaved(_value(experts.gate_up_proj_bias))
    return BlockWeights(
        # Softmax over the k best logits = the k best softmax scores renormalised.
        router_args=dict(
            num_experts=block.num_experts, k=block.top_k, normalize_top_k=True, use_bias=True
        ),
        experts_args=dict(
            num_experts=block.num_experts,
            d_ff=block.intermediate_dim,
            activation="clamped-swiglu",
            use_bias=True,
            swiglu_alpha=float(experts.alpha),
            swiglu_limit=float(experts.limit),
        ),
        router=dict(
            kernel=_value(block.router.router_dense.kernel),
            bias=_value(block.router.router_dense.bias),
        ),
        experts=dict(
            wi_0=gate,
            wi_1=up,
            bi_0=gate_bias,
            bi_1=up_bias,
            wo=_value(experts.down_proj),
            bo=_value(experts.down_proj_bias),
        ),
        # keras-hub's gpt-oss block has no load-balancing loss.
        aux_loss_factor=0.0,
    )


FAMILIES = (
    Family(
        "Mixtral",
        "keras_hub.src.models.mixtral.mixtral_decoder",
        "MixtralSparseMoeBlock",
        "_sparse_moe_block",
        _read_mixtral,
    ),
    Family(
        "QwenMoe",
        "keras_hub.src.models.qwen_moe.qwen_moe_decoder",
        "QwenSparseMoeBlock",
        "mlp",
        _read_qwen,
    ),
    Family(
        "Qwen3Moe",
        "keras_hub.src.models.qwen3_moe.qwen3_moe_decoder",
        "Qwen3SparseMoeBlock",
        "mlp",
        _read_qwen3,
    ),
    Family(
        "GptOss",
        "keras_hub.src.models.gpt_oss.gpt_oss_decoder",
        "GptOssSparseMoeBlock",
        "sparse_moe_block",
        _read_gpt_oss,
    ),
)
# keras-hub MoE families whose blocks do not map onto keras_moe's layers (yet), and why.
UNSUPPORTED = {
    "Qwen3_5Moe": "its MoE block is not mapped yet",
    "Gemma4": "its router normalises the input (RMSNorm with a per-dimension scale) and "
    "scales each expert's output, which TopKRouter and FeedForwardExperts do not",
}
