"""Import and export HuggingFace `T5ForConditionalGeneration` and
`SwitchTransformersForConditionalGeneration`.

Reads a local folder with `config.json` and `*.safetensors` (sharded or not)
using NumPy and safetensors only: no torch at run time.

How HF SwitchTransformers semantics map to ours (transformers 5.x):
- Placement: HF makes layer i sparse iff `i % step == 1 or step == 1`
  (`*_sparse_step` in config.json, else `num_layers // num_sparse_*_layers`).
  We convert that into explicit `encoder_sparse_layers` / `decoder_sparse_layers`,
  so the imported model has exactly HF's sparse layers (including HF's quirk
  of one sparse layer when `num_sparse_*_layers = 0` and `num_layers > 1`).
- Capacity: HF routes each sequence as one group with a fixed
  `expert_capacity` slots per expert, in sequence order. We use
  `group_size=None` (one group per sequence) and get exactly that capacity with
  `min_expert_capacity=expert_capacity` and a tiny capacity factor
  (`capacity="hf"`, the default). `capacity="factor"` keeps our factor-based
  capacity (`T5Config` defaults, or your overrides) for fine-tuning.
- Dropped tokens: HF (5.x) gives them a zero MoE output, as we do; the
  residual carries them.
- Padding: HF ignores `router_ignore_padding_tokens` in its forward pass, so
  padding tokens take capacity there; we pass the padding mask and they take
  none. With right padding (T5's) padding comes after every real token in the
  priority order, so real tokens are routed identically; only the outputs at
  padding positions differ (HF: expert output; ours: 0).
- Router: `router_bias` -> `router_bias`; `router_jitter_noise` ->
  `jitter_noise` (training only in both); router in float32 in both.
- Losses: `router_aux_loss_coef` -> `aux_loss_factor`, `router_z_loss_coef` ->
  `z_loss_factor`. HF only adds them when asked for router logits.
- Logits: tied checkpoints (no `lm_head.weight`) project with the shared
  embedding; the `d_model ** -0.5` scaling follows `scale_decoder_outputs`
  (T5, transformers >= 5) or `tie_word_embeddings` (older T5, Switch).
- Embeddings: one input embedding shared by encoder and decoder. HF (5.x)
  unties `encoder/decoder.embed_tokens` (and `lm_head`) from `shared` when a
  SwitchTransformers config has `tie_word_embeddings=False`; such a checkpoint
  is refused with a ValueError unless they are equal (as in the published
  checkpoints). `to_hf` writes them as copies of `shared.weight` there, so HF
  loads no missing key. HF's T5 always ties `embed_tokens` to `shared`, and
  ties `lm_head` too unless the checkpoint's `lm_head.weight` differs (T5 v1.1:
  HF then logs that it does not tie them); an untied model is exported that way.
- Activations: "relu", "gated-gelu" / "gelu_new" (tanh GELU), "gated-relu",
  "gated-silu" / "silu". HF's exact-erf "gelu" is not supported (ours is tanh).
"""

import glob
import json
import math
import os

import numpy as np

from keras_moe.convert.hf_config import config_from_hf, config_to_hf
from keras_moe.models.transformer import EncoderDecoder


def load_hf_weights(path):
    """All tensors of the `*.safetensors` files in `path` as a dict of NumPy arrays."""
    from safetensors.numpy import load_file

    files = sorted(glob.glob(os.path.join(path, "*.safetensors")))
    if not files:
        raise ValueError(f"no *.safetensors file in {path!r}.")
    weights = {}
    for name in files:
        weights.update(load_file(name))
    return weights


def _attention(prefix, attn):
    return [
        (f"{prefix}.q.weight", attn.query, "T"),
        (f"{prefix}.k.weight", attn.key, "T"),
        (f"{prefix}.v.weight", attn.value, "T"),
        (f"{prefix}.o.weight", attn.output_kernel, "T"),
    ]


def _ffn(prefix, block, weights, style):
    ffn = block.ffn
    if block.is_sparse:
        out = [(f"{prefix}.mlp.router.classifier.weight", ffn.router.kernel, "T")]
        if ffn.router.use_bias:
            out.append((f"{prefix}.mlp.router.classifier.bias", ffn.router.bias, "id"))
        names = ("wi_0", "wi_1", "wo") if ffn.experts.gated else ("wi", "wo")
        for n in names:
            out.append(
                (
                    f"{prefix}.mlp.experts.expert_{{e}}.{n}.weight",
                    getattr(ffn.experts, n),
                    "experts",
                )
            )
        return out
    mlp = style
    if weights is not None:
        mlp = "mlp" if any(k.startswith(f"{prefix}.mlp.") for k in weights) else "DenseReluDense"
    names = ("wi_0", "wi_1", "wo") if ffn.gated else ("wi", "wo")
    return [(f"{prefix}.{mlp}.{n}.weight", getattr(ffn, n), "T") for n in names]


def _weight_map(model, weights=None, style="DenseReluDense"):
    """(hf_name, keras variable, how) triples; how in {"T", "id", "experts"}."""
    out = [("shared.weight", model.token_embedding.embeddings, "id")]
    if model.lm_head is not None:
        out.append(("lm_head.weight", model.lm_head.kernel, "T"))
    for side, layers, bias, norm in (
        ("encoder", model.encoder_layers, model.encoder_position_bias, model.encoder_norm),
        ("decoder", model.decoder_layers, model.decoder_position_bias, model.decoder_norm),
    ):
        out.append(
            (
                f"{side}.block.0.layer.0.SelfAttention.relative_attention_bias.weight",
                bias.embeddings,
                "id",
            )
        )
        out.append((f"{side}.final_layer_norm.weight", norm.scale, "id"))
        for i, block in enumerate(layers):
            p = f"{side}.block.{i}.layer"
            if side == "encoder":
                out.append((f"{p}.0.layer_norm.weight", block.attention_norm.scale, "id"))
                out += _attention(f"{p}.0.SelfAttention", block.attention)
                out.append((f"{p}.1.layer_norm.weight", block.ffn_norm.scale, "id"))
                out += _ffn(f"{p}.1", block, weights, style)
            else:
                out.append((f"{p}.0.layer_norm.weight", block.self_attention_norm.scale, "id"))
                out += _attention(f"{p}.0.SelfAttention", block.self_attention)
                out.append((f"{p}.1.layer_norm.weight", block.cross_attention_norm.scale, "id"))
                out += _attention(f"{p}.1.EncDecAttention", block.cross_attention)
                out.append((f"{p}.2.layer_norm.weight", block.ffn_norm.scale, "id"))
                out += _ffn(f"{p}.2", block, weights, style)
    return out


def is_hf_folder(path: str) -> bool:
    """Whether `path` is a Hugging Face model folder (it holds a `config.json`).

    Example:
    >>> import tempfile
    >>> is_hf_folder(tempfile.gettempdir())
    False
    """
    return os.path.isdir(path) and os.path.isfile(os.path.join(path, "config.json"))


def from_hf(path, capacity="hf", dtype=None, **overrides):
    """Builds a keras_moe model from a HF T5 (v1.1) or SwitchTransformers folder.

    Args:
        path: folder with `config.json` and `*.safetensors`.
        capacity: "hf" to reproduce HF's fixed `expert_capacity`, or "factor"
            to use capacity factors (see module docstring).
        dtype: Keras dtype policy for the model (default: the global policy).
        **overrides: `T5Config` fields to change (e.g. `dropout_rate=0.0`).

    Returns:
        an `EncoderDecoder`; `model(features)` returns the logits.

    Example:
    >>> import os, shutil, tempfile
    >>> import numpy as np
    >>> from keras_moe import SwitchFeedForward
    >>> from keras_moe.models import EncoderDecoder, T5Config
    >>> original = EncoderDecoder(T5Config(vocab_size=32, d_model=16, num_heads=2, d_kv=8,
    ...     d_ff=32, num_encoder_layers=2, num_decoder_layers=2, activation="relu",
    ...     encoder_sparse_step=2, decoder_sparse_step=2,
    ...     sparse_ffn=SwitchFeedForward(num_experts=4, d_ff=32, activation="relu")))
    >>> folder = to_hf(original, os.path.join(tempfile.mkdtemp(), "switch-tiny"))
    >>> model = from_hf(folder)
    >>> features = {"encoder_input_tokens": np.array([[5, 6, 1]]),
    ...             "decoder_input_tokens": np.array([[0, 7]])}
    >>> bool(np.allclose(model(features), original(features), atol=1e-5))
    True
    >>> tokens = model.generate(np.array([[5, 6, 1]]), max_length=8)
    >>> tokens.shape[0], tokens.shape[1] <= 8
    (1, True)
    >>> shutil.rmtree(os.path.dirname(folder))
    """
    with open(os.path.join(path, "config.json")) as f:
        cfg = json.load(f)
    config_from_hf(cfg)  # fail early on an unsupported config
    weights = load_hf_weights(path)
    has_lm_head = "lm_head.weight" in weights and not np.array_equal(
        weights["lm_head.weight"], weights.get("shared.weight")
    )
    config = config_from_hf(cfg, has_lm_head=has_lm_head, capacity=capacity, **overrides)
    kwargs = {"dtype": dtype} if dtype is not None else {}
    model = EncoderDecoder(config, **kwargs)
    if "shared.weight" not in weights and "encoder.embed_tokens.weight" in weights:
        weights["shared.weight"] = weights["encoder.embed_tokens.weight"]
    for key in ("encoder.embed_tokens.weight", "decoder.embed_tokens.weight"):
        if key in weights and not np.array_equal(weights[key], weights["shared.weight"]):
            raise ValueError(
                f"{key} differs from shared.weight: separate encoder/decoder input embeddings "
                "are not supported (T5 and Switch checkpoints share one)."
            )
    used = set()
    for name, variable, how in _weight_map(model, weights):
        if how == "experts":
            keys = [name.format(e=e) for e in range(config.num_experts)]
            missing = [k for k in keys if k not in weights]
            if missing:
                raise ValueError(f"checkpoint is missing {missing[:3]}...")
            value = np.stack([weights[k].T for k in keys])
            used.update(keys)
        else:
            if name not in weights:
                raise ValueError(f"checkpoint is missing weight {name!r}.")
            value = weights[name].T if how == "T" else weights[name]
            used.add(name)
        if tuple(value.shape) != tuple(variable.shape):
            raise ValueError(f"{name}: shape {value.shape} does not fit {tuple(variable.shape)}.")
        variable.assign(value.astype(variable.dtype))
    ignorable = ("encoder.embed_tokens.weight", "decoder.embed_tokens.weight", "lm_head.weight")
    unused = sorted(
        k
        for k in weights
        if k not in used
        and k not in ignorable
        and "EncDecAttention.relative_attention_bias" not in k
    )
    if unused:
        raise ValueError(f"checkpoint weights not used by the model: {unused[:5]}...")
    return model


def _hf_unties_input_embeddings(cfg):
    """Whether HF (5.x) gives `encoder/decoder.embed_tokens` their own weights for `cfg`.

    SwitchTransformers ties them to `shared` (with `lm_head`) only when
    `tie_word_embeddings` is true; T5's config always sets it to True.
    """
    return cfg["model_type"] == "switch_transformers" and not cfg["tie_word_embeddings"]


def to_hf(model, path, expert_capacity=None):
    """Writes `config.json` and `model.safetensors` that HF transformers can load.

    Args:
        model: an `EncoderDecoder`.
        path: output folder (created).
        expert_capacity: HF's fixed capacity for Switch models; default
            the Switch layers' `min_expert_capacity` (exact for models from `from_hf`).

    Example:
    >>> import json, os, shutil, tempfile
    >>> from keras_moe import SwitchFeedForward
    >>> from keras_moe.models import EncoderDecoder, T5Config
    >>> model = EncoderDecoder(T5Config(vocab_size=32, d_model=16, num_heads=2, d_kv=8,
    ...     d_ff=32, num_encoder_layers=2, num_decoder_layers=2, activation="relu",
    ...     encoder_sparse_step=2, decoder_sparse_step=2,
    ...     sparse_ffn=SwitchFeedForward(num_experts=4, d_ff=32, activation="relu")))
    >>> folder = to_hf(model, os.path.join(tempfile.mkdtemp(), "export"))
    >>> sorted(os.listdir(folder))
    ['config.json', 'model.safetensors']
    >>> with open(os.path.join(folder, "config.json")) as f:
    ...     cfg = json.load(f)
    >>> cfg["model_type"], cfg["num_experts"], cfg["encoder_sparse_step"], cfg["expert_capacity"]
    ('switch_transformers', 4, 2, 4)
    >>> from_hf(folder).config.encoder_sparse_layers  # read back
    (1,)
    >>> shutil.rmtree(os.path.dirname(folder))
    """
    from safetensors.numpy import save_file

    cfg = config_to_hf(model.config, expert_capacity)
    style = "mlp" if cfg["model_type"] == "switch_transformers" else "DenseReluDense"
    tensors = {}
    for name, variable, how in _weight_map(model, None, style):
        value = np.asarray(variable.numpy() if hasattr(variable, "numpy") else variable, np.float32)
        if how == "experts":
            for e in range(model.config.num_experts):
                tensors[name.format(e=e)] = np.ascontiguousarray(value[e].T)
        else:
            tensors[name] = np.ascontiguousarray(value.T if how == "T" else value)
    if _hf_unties_input_embeddings(cfg):
        # Otherwise HF reports them missing and initialises them at random.
        for key in ("encoder.embed_tokens.weight", "decoder.embed_tokens.weight"):
            tensors[key] = tensors["shared.weight"].copy()
    os.makedirs(path, exist_ok=True)
    save_file(tensors, os.path.join(path, "model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    return path


del math
