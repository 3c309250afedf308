"""Tiny random Hugging Face MoE checkpoints, written locally by `transformers` (no network).

One folder per keras-hub family, as `save_pretrained` writes it (transformers v5
spellings: `num_local_experts`, `rope_parameters`; gpt-oss's experts as plain
tensors).
"""

import os

D_MODEL = 32
VOCAB = 96
COMMON = dict(vocab_size=VOCAB, hidden_size=D_MODEL, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=64, tie_word_embeddings=False)
# family -> (transformers config class, causal LM class, the family's own fields)
SPECS = {
    "Mixtral": ("MixtralConfig", "MixtralForCausalLM",
                dict(intermediate_size=48, num_local_experts=8, num_experts_per_tok=2)),
    "QwenMoe": ("Qwen2MoeConfig", "Qwen2MoeForCausalLM",
                dict(intermediate_size=48, moe_intermediate_size=24,
                     shared_expert_intermediate_size=40, num_experts=8, num_experts_per_tok=2,
                     norm_topk_prob=False)),
    "Qwen3Moe": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM",
                 dict(intermediate_size=48, moe_intermediate_size=16, num_experts=16,
                      num_experts_per_tok=4, norm_topk_prob=True, head_dim=8)),
    "GptOss": ("GptOssConfig", "GptOssForCausalLM",
               dict(intermediate_size=24, num_local_experts=8, num_experts_per_tok=2, head_dim=8,
                    sliding_window=16, layer_types=["sliding_attention", "full_attention"])),
}
FAMILIES = tuple(SPECS)


def write_checkpoint(family, folder, seed=0):
    """Writes a tiny random `family` model to `folder`; returns the folder."""
    import torch
    import transformers

    config_class, model_class, fields = SPECS[family]
    torch.manual_seed(seed)
    config = getattr(transformers, config_class)(**COMMON, **fields)
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
