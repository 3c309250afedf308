"""HF transformers' Qwen2-MoE and OLMoE sparse blocks (torch, CPU) and their keras_moe twins.

`qwen2_moe_pair` and `olmoe_pair` give random float32 weights to the HF block
and copy them into a `keras_moe.TopKFeedForward` of the same shape. Shared by
test_hf_moe_blocks.py (TensorFlow) and hf_moe_jax_checks.py (JAX); no
backend-specific imports here.

HF 5.x keeps the experts as fused 3-D parameters: `gate_up_proj [E, 2 ff, d]`
(rows `:ff` the SiLU-gated half, rows `ff:` the linear half) and
`down_proj [E, d, ff]`; its `nn.Linear`s and the router store `[out, in]`.
keras_moe stores `[in, out]`: every kernel is transposed on the way over.
"""

import numpy as np
import torch
from transformers import OlmoeConfig, Qwen2MoeConfig
from transformers.models.olmoe import modeling_olmoe as olmoe
from transformers.models.qwen2_moe import modeling_qwen2_moe as qwen2_moe

import keras_moe

D = 16  # hidden size of both blocks
WEIGHT_STD = 0.3


def _fill(module, rng):
    """Gives every parameter of `module` normal(0, WEIGHT_STD) float32 values."""
    with torch.no_grad():
        for param in module.parameters():
            param.copy_(
                torch.from_numpy(
                    rng.normal(0, WEIGHT_STD, size=tuple(param.shape)).astype("float32")
                )
            )


def _t(param):
    return param.detach().numpy().T


def _keras_layer(num_experts, d_ff, k, normalize_top_k, dispatch, **kwargs):
    # Capacity factor E: every expert has a slot for every token, nothing drops.
    layer = keras_moe.TopKFeedForward(
        num_experts,
        d_ff,
        k=k,
        normalize_top_k=normalize_top_k,
        activation="gated-silu",
        dispatch=dispatch,
        train_capacity_factor=float(num_experts),
        eval_capacity_factor=float(num_experts),
        aux_loss_factor=0.0,
        z_loss_factor=0.0,
        track_metrics=False,
        **kwargs,
    )
    layer.build((None, None, D))
    return layer


def copy_experts(hf_experts, layer, swap_gate_up=False):
    """Copies HF's fused expert weights into `layer.experts`; `swap_gate_up`
    copies the two halves of `gate_up_proj` the wrong way round (for the
    tests that show the mapping matters)."""
    gate_up = hf_experts.gate_up_proj.detach().numpy()  # [E, 2 ff, d]
    ff = gate_up.shape[1] // 2
    gate, up = gate_up[:, :ff], gate_up[:, ff:]
    if swap_gate_up:
        gate, up = up, gate
    layer.experts.wi_0.assign(np.transpose(gate, (0, 2, 1)))
    layer.experts.wi_1.assign(np.transpose(up, (0, 2, 1)))
    layer.experts.wo.assign(np.transpose(hf_experts.down_proj.detach().numpy(), (0, 2, 1)))


def qwen2_moe_pair(
    rng, norm_topk_prob, dispatch="dropless", num_experts=8, k=2, d_ff=8, shared_d_ff=12, **kwargs
):
    """(HF Qwen2MoeSparseMoeBlock, TopKFeedForward with its weights)."""
    config = Qwen2MoeConfig(
        hidden_size=D,
        num_experts=num_experts,
        num_experts_per_tok=k,
        moe_intermediate_size=d_ff,
        shared_expert_intermediate_size=shared_d_ff,
        norm_topk_prob=norm_topk_prob,
        hidden_act="silu",
    )
    config._experts_implementation = "eager"  # the per-expert loop, as written in the model file
    hf = qwen2_moe.Qwen2MoeSparseMoeBlock(config).eval()
    _fill(hf, rng)
    layer = _keras_layer(
        num_experts,
        d_ff,
        k,
        norm_topk_prob,
        dispatch,
        shared_d_ff=shared_d_ff,
        shared_expert_gate=True,
        **kwargs,
    )
    layer.router.kernel.assign(_t(hf.gate.weight))
    copy_experts(hf.experts, layer)
    shared = layer.shared_experts
    shared.wi_0.assign(_t(hf.shared_expert.gate_proj.weight))
    shared.wi_1.assign(_t(hf.shared_expert.up_proj.weight))
    shared.wo.assign(_t(hf.shared_expert.down_proj.weight))
    shared.gate_kernel.assign(_t(hf.shared_expert_gate.weight))
    return hf, layer


def olmoe_pair(
    rng, dispatch="dropless", num_experts=16, k=4, d_ff=8, norm_topk_prob=False, **kwargs
):
    """(HF OlmoeSparseMoeBlock, TopKFeedForward with its weights); OLMoE's
    released models use norm_topk_prob=False."""
    config = OlmoeConfig(
        hidden_size=D,
        num_experts=num_experts,
        num_experts_per_tok=k,
        intermediate_size=d_ff,
        norm_topk_prob=norm_topk_prob,
        hidden_act="silu",
    )
    config._experts_implementation = "eager"
    hf = olmoe.OlmoeSparseMoeBlock(config).eval()
    _fill(hf, rng)
    layer = _keras_layer(num_experts, d_ff, k, norm_topk_prob, dispatch, **kwargs)
    layer.router.kernel.assign(_t(hf.gate.weight))
    copy_experts(hf.experts, layer)
    return hf, layer


def hf_outputs(hf, x):
    """(block output [B, L, d], router logits [B, L, E]) of the HF block for numpy `x`."""
    with torch.no_grad():
        xt = torch.from_numpy(x)
        out = hf(xt).numpy()
        logits, _, _ = hf.gate(xt)
    return out, logits.numpy().reshape(x.shape[:-1] + (-1,))
