"""The HF `config.json` of a T5 (v1.1) or SwitchTransformers checkpoint <-> `T5Config`.

`config_from_hf` reads HF's fields into a `T5Config` (Switch layers sparse where
HF's `sparse_step` rule puts them, with HF's fixed expert capacity or capacity
factors) and `config_to_hf` writes one back; the module docstring of
`keras_moe.convert.hf` lists how each HF setting maps to ours.
"""

import functools

from keras_moe.layers.feedforward import SwitchFeedForward
from keras_moe.models.config import T5Config, hf_sparse_layers

_GATED = {
    "gated-gelu": "gated-gelu",
    "gated-gelu_new": "gated-gelu",
    "gated-relu": "gated-relu",
    "gated-silu": "gated-silu",
}
_PLAIN = {"relu": "relu", "gelu_new": "gelu", "gelu_pytorch_tanh": "gelu", "silu": "silu"}


def _activation(cfg):
    proj = cfg.get("feed_forward_proj")
    if proj is None:  # SwitchTransformers
        proj = cfg.get("dense_act_fn", "relu")
    if proj in _GATED:
        return _GATED[proj]
    if proj in _PLAIN:
        act = _PLAIN[proj]
        if act == "silu":
            raise ValueError("`feed_forward_proj` 'silu' (ungated) is not supported.")
        return act
    raise ValueError(
        f"`feed_forward_proj`/`dense_act_fn` {proj!r} is not supported; use one of "
        f"{sorted(_GATED) + sorted(_PLAIN)} (HF's exact-erf 'gelu' differs from our tanh GELU)."
    )


def _hf_step(cfg, side):
    num = cfg["num_layers"]
    if side != "encoder":
        num = cfg.get("num_decoder_layers") or num
    step = cfg.get(f"{side}_sparse_step")
    if step is None:
        sparse = cfg.get(f"num_sparse_{side}_layers", 0)
        step = num // sparse if sparse > 0 else num
    return num, step


def config_from_hf(cfg, has_lm_head=False, capacity="hf", **overrides):
    """`T5Config` for a HF config dict (`config.json` contents).

    Args:
        cfg: dict from `config.json` (model_type "t5" or "switch_transformers").
        has_lm_head: whether the checkpoint has its own `lm_head.weight`.
        capacity: "hf" (exactly HF's `expert_capacity`) or "factor".
        **overrides: `T5Config` fields to set; `sparse_overrides` (a dict) sets
            arguments of the Switch layers (e.g. `dispatch`).

    Example:
    >>> import json, os, shutil, tempfile
    >>> folder = tempfile.mkdtemp()
    >>> with open(os.path.join(folder, "config.json"), "w") as f:  # a tiny switch-base-8
    ...     json.dump({"model_type": "switch_transformers", "vocab_size": 64, "d_model": 16,
    ...                "d_kv": 8, "d_ff": 32, "num_heads": 2, "num_layers": 4,
    ...                "num_experts": 8, "num_sparse_encoder_layers": 2,
    ...                "num_sparse_decoder_layers": 2, "expert_capacity": 4}, f)
    >>> with open(os.path.join(folder, "config.json")) as f:
    ...     config = config_from_hf(json.load(f))
    >>> config.sparse_ffn["class_name"], config.num_experts, config.encoder_sparse_layers
    ('keras_moe>SwitchFeedForward', 8, (1, 3))
    >>> config.sparse_option("group_size"), config.sparse_option("min_expert_capacity")
    ('sequence', 4)
    >>> shutil.rmtree(folder)
    """
    model_type = cfg.get("model_type", "t5")
    if model_type not in ("t5", "switch_transformers"):
        raise ValueError(f"`model_type` must be 't5' or 'switch_transformers', got {model_type!r}.")
    if capacity not in ("hf", "factor"):
        raise ValueError(f"`capacity` must be 'hf' or 'factor', got {capacity!r}.")
    tie = not has_lm_head
    if model_type == "t5":
        scale = cfg.get("scale_decoder_outputs", cfg.get("tie_word_embeddings", True) is not False)
    else:
        scale = cfg.get("tie_word_embeddings", True) is not False
    num_dec = cfg.get("num_decoder_layers") or cfg["num_layers"]
    args = dict(
        vocab_size=cfg["vocab_size"],
        d_model=cfg["d_model"],
        num_heads=cfg["num_heads"],
        d_kv=cfg["d_kv"],
        d_ff=cfg["d_ff"],
        num_encoder_layers=cfg["num_layers"],
        num_decoder_layers=num_dec,
        activation=_activation(cfg),
        dropout_rate=cfg.get("dropout_rate", 0.1),
        layer_norm_epsilon=cfg.get("layer_norm_epsilon", 1e-6),
        relative_attention_num_buckets=cfg.get("relative_attention_num_buckets", 32),
        relative_attention_max_distance=cfg.get("relative_attention_max_distance", 128),
        tie_word_embeddings=tie,
        scale_decoder_outputs=bool(scale),
        pad_id=cfg.get("pad_token_id", 0) or 0,
        eos_id=_first(cfg.get("eos_token_id", 1)),
        decoder_start_id=cfg.get("decoder_start_token_id", 0) or 0,
    )
    if model_type == "switch_transformers":
        enc = hf_sparse_layers(*_hf_step(cfg, "encoder"))
        dec = hf_sparse_layers(*_hf_step(cfg, "decoder"))
        switch = dict(
            num_experts=cfg["num_experts"],
            d_ff=cfg["d_ff"],
            activation=args["activation"],
            jitter_noise=cfg.get("router_jitter_noise", 0.01),
            router_bias=bool(cfg.get("router_bias", False)),
            aux_loss_factor=cfg.get("router_aux_loss_coef", 1e-3),
            z_loss_factor=cfg.get("router_z_loss_coef", 1e-3),
            group_size="sequence",
        )
        if capacity == "hf":
            switch.update(
                min_expert_capacity=int(cfg.get("expert_capacity", 64)),
                train_capacity_factor=1e-6,
                eval_capacity_factor=1e-6,
            )
        switch.update(overrides.pop("sparse_overrides", None) or {})
        args.update(
            encoder_sparse_layers=enc,
            decoder_sparse_layers=dec,
            sparse_ffn=functools.partial(SwitchFeedForward, **switch),
        )
    args.update(overrides)
    return T5Config(**args)


def _first(value):
    return value[0] if isinstance(value, (list, tuple)) else value


def _hf_step_for(layers, num_layers):
    layers = tuple(layers)
    for step in range(0, num_layers + 1):
        if hf_sparse_layers(num_layers, step) == layers:
            return step
    raise ValueError(
        f"sparse layers {layers} cannot be expressed with HF's `sparse_step` rule "
        "(`i % step == 1 or step == 1`); HF cannot load this placement."
    )


def config_to_hf(config, expert_capacity=None):
    """HF `config.json` dict for a `T5Config` (inverse of `config_from_hf`)."""
    act = config.activation
    out = dict(
        vocab_size=config.vocab_size,
        d_model=config.d_model,
        d_kv=config.head_dim,
        d_ff=config.d_ff,
        num_layers=config.num_encoder_layers,
        num_decoder_layers=config.num_decoder_layers,
        num_heads=config.num_heads,
        relative_attention_num_buckets=config.relative_attention_num_buckets,
        relative_attention_max_distance=config.relative_attention_max_distance,
        dropout_rate=config.dropout_rate,
        layer_norm_epsilon=config.layer_norm_epsilon,
        pad_token_id=config.pad_id,
        eos_token_id=config.eos_id,
        decoder_start_token_id=config.decoder_start_id,
        is_encoder_decoder=True,
    )
    enc = config.resolved_encoder_sparse_layers()
    dec = config.resolved_decoder_sparse_layers()
    if not enc and not dec:
        # HF (5.x) T5 ignores `tie_word_embeddings` beyond the default of
        # `scale_decoder_outputs` (written explicitly) and always ties; an untied
        # model's own `lm_head.weight` differs from `shared.weight`, so HF keeps
        # it (as for T5 v1.1 checkpoints, whose config says False, as here).
        out.update(
            model_type="t5",
            architectures=["T5ForConditionalGeneration"],
            feed_forward_proj="gated-gelu" if act == "gated-gelu" else act,
            tie_word_embeddings=bool(config.tie_word_embeddings),
            scale_decoder_outputs=config.scales_decoder_outputs,
        )
        return out
    specs = config.used_sparse_ffn_specs()
    if (
        any(spec != specs[0] for spec in specs)
        or specs[0]["class_name"] != "keras_moe>SwitchFeedForward"
        or act.startswith("gated-")
        or config.sparse_option("activation") != act
    ):
        raise ValueError(
            "only Switch models with ungated experts (the same `SwitchFeedForward` "
            "in both stacks, with the model's activation) can be exported to HF."
        )
    if config.tie_word_embeddings != config.scales_decoder_outputs:
        raise ValueError("HF SwitchTransformers scales the output iff embeddings are tied.")
    if config.sparse_option("d_ff") != config.d_ff:
        raise ValueError("HF SwitchTransformers needs the experts' `d_ff` equal to `d_ff`.")
    enc_step = _hf_step_for(enc, config.num_encoder_layers)
    dec_step = _hf_step_for(dec, config.num_decoder_layers)
    if expert_capacity is None:
        expert_capacity = config.sparse_option("min_expert_capacity")
    out.update(
        model_type="switch_transformers",
        architectures=["SwitchTransformersForConditionalGeneration"],
        dense_act_fn={"gelu": "gelu_new"}.get(act, act),
        num_experts=config.num_experts,
        expert_capacity=int(expert_capacity),
        encoder_sparse_step=enc_step,
        decoder_sparse_step=dec_step,
        num_sparse_encoder_layers=len(enc),
        num_sparse_decoder_layers=len(dec),
        router_bias=config.sparse_option("router_bias"),
        router_jitter_noise=config.sparse_option("jitter_noise"),
        router_aux_loss_coef=config.sparse_option("aux_loss_factor"),
        router_z_loss_coef=config.sparse_option("z_loss_factor"),
        router_dtype="float32",
        tie_word_embeddings=config.tie_word_embeddings,
    )
    return out
