"""Tiny random Hugging Face MoE checkpoints, written locally by `transformers` (no network).

One folder per keras-hub family, as `save_pretrained` writes it (transformers v5
spellings: `num_local_experts`, `rope_parameters`; gpt-oss's experts as plain
tensors).
"""

import os

import numpy as np

D_MODEL = 32
VOCAB = 96
COMMON = dict(
    vocab_size=VOCAB,
    hidden_size=D_MODEL,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=64,
    tie_word_embeddings=False,
)
# family -> (transformers config class, causal LM class, the family's own fields)
SPECS = {
    "Mixtral": (
        "MixtralConfig",
        "MixtralForCausalLM",
        dict(intermediate_size=48, num_local_experts=8, num_experts_per_tok=2),
    ),
    "QwenMoe": (
        "Qwen2MoeConfig",
        "Qwen2MoeForCausalLM",
        dict(
            intermediate_size=48,
            moe_intermediate_size=24,
            shared_expert_intermediate_size=40,
            num_experts=8,
            num_experts_per_tok=2,
            norm_topk_prob=False,
        ),
    ),
    "Qwen3Moe": (
        "Qwen3MoeConfig",
        "Qwen3MoeForCausalLM",
        dict(
            intermediate_size=48,
            moe_intermediate_size=16,
            num_experts=16,
            num_experts_per_tok=4,
            norm_topk_prob=True,
            head_dim=8,
        ),
    ),
    "GptOss": (
        "GptOssConfig",
        "GptOssForCausalLM",
        dict(
            intermediate_size=24,
            num_local_experts=8,
            num_experts_per_tok=2,
            head_dim=8,
            sliding_window=16,
            layer_types=["sliding_attention", "full_attention"],
        ),
    ),
}
FAMILIES = tuple(SPECS)


def write_checkpoint(family, folder, seed=0, **overrides):
    """Writes a tiny random `family` model (its fields changed by `overrides`) to
    `folder`; returns the folder."""
    import torch
    import transformers

    config_class, model_class, fields = SPECS[family]
    torch.manual_seed(seed)
    config = getattr(transformers, config_class)(**COMMON, **{**fields, **overrides})
    model = getattr(transformers, model_class)(config).eval()
    with torch.no_grad():  # gpt-oss's init leaves its expert biases 0: give them values
        for name, parameter in model.named_parameters():
            if name.endswith("_bias") or name.endswith("router.bias"):
                parameter.normal_(0.0, 0.5)
    model.save_pretrained(folder)
    return folder


def write_checkpoints(root):
    """`{family: folder}` of every family's tiny checkpoint under `root`."""
    return {family: write_checkpoint(family, os.path.join(root, family)) for family in FAMILIES}


# OCP MX E2M1 (4-bit float) values by code, sign bit last: 0, 0.5, 1, 1.5, 2, 3, 4, 6.
E2M1 = np.array(
    [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0]
)


def write_mxfp4_gpt_oss(plain_folder, mxfp4_folder, seed=0):
    """Rewrites `plain_folder`'s gpt-oss checkpoint with MXFP4 experts, as the published
    ones store them (`*_blocks`: uint8 [E, out, in / 32, 16], two 4-bit codes a byte, low
    first; `*_scales`: uint8 [E, out, in / 32], 2 ** (s - 127)), from random codes;
    `plain_folder` gets the same experts dequantized here, as plain tensors."""
    import json
    import shutil

    from safetensors.numpy import load_file, save_file

    rng = np.random.default_rng(seed)
    tensors = load_file(os.path.join(plain_folder, "model.safetensors"))
    quantized = dict(tensors)
    for name in [n for n in tensors if n.endswith(("experts.gate_up_proj", "experts.down_proj"))]:
        experts, inputs, outputs = tensors[name].shape
        blocks = inputs // 32
        codes = rng.integers(0, 16, size=(experts, outputs, blocks, 32))
        scales = rng.integers(124, 128, size=(experts, outputs, blocks)).astype("uint8")
        values = E2M1[codes] * 2.0 ** (scales.astype("float64")[..., None] - 127)
        # Contiguous: safetensors' save_file writes a transposed view's buffer as it lies.
        tensors[name] = np.ascontiguousarray(
            values.reshape(experts, outputs, inputs).transpose(0, 2, 1), dtype="float32"
        )
        del quantized[name]
        quantized[name + "_blocks"] = (codes[..., 0::2] | (codes[..., 1::2] << 4)).astype("uint8")
        quantized[name + "_scales"] = scales
    save_file(tensors, os.path.join(plain_folder, "model.safetensors"), metadata={"format": "pt"})
    os.makedirs(mxfp4_folder, exist_ok=True)
    save_file(quantized, os.path.join(mxfp4_folder, "model.safetensors"), metadata={"format": "pt"})
    for name in ("config.json", "generation_config.json"):
        shutil.copy(os.path.join(plain_folder, name), mxfp4_folder)
    with open(os.path.join(mxfp4_folder, "config.json")) as f:
        assert json.load(f)["model_type"] == "gpt_oss"
    return plain_folder, mxfp4_folder
