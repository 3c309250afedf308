"""`T5Config`: the architecture of a T5.1.1 / Switch / GShard encoder-decoder.

A plain dataclass, so the library is usable without gin; `gin_configurables`
registers it for gin files. All validation happens in `__post_init__`, so a
bad config fails before any weight is created.

Sparse layer placement (our convention, documented and tested):
- explicit lists (`encoder_sparse_layers`, `decoder_sparse_layers`) win;
- otherwise, with `*_sparse_step = s > 0`, layer `i` (0-based) is sparse iff
  `i % s == s - 1`: `s=1` makes every layer sparse, `s=2` layers 1, 3, 5, ...
  (the Switch Transformer's "every other layer"), `s=3` layers 2, 5, 8, ...
- `s = 0` means no sparse layer.
HuggingFace `SwitchTransformers` uses `i % s == 1 or s == 1` instead, which
agrees with ours for s in (1, 2) but not for s >= 3 (and gives one sparse
layer when it means "none", s = num_layers); `keras_moe.convert.from_hf`
therefore converts HF placement to explicit lists (`hf_sparse_layers`).
"""

import dataclasses
from typing import Optional, Sequence, Union

from keras_moe.dispatch import DISPATCH_MODES
from keras_moe.ffn import ACTIVATIONS
from keras_moe.moe import GROUPINGS
from keras_moe.validation import check_int, is_int, is_number

MOE_TYPES = ("switch", "gshard")


ROUTER_DTYPES = ("float32", "bfloat16", "mixed_bfloat16")

def sparse_layers_from_step(num_layers, sparse_step):
    """Our placement rule: layer i is sparse iff `i % step == step - 1`."""
    if not sparse_step:
        return ()
    return tuple(i for i in range(num_layers) if i % sparse_step == sparse_step - 1)


def hf_sparse_layers(num_layers, sparse_step):
    """HuggingFace SwitchTransformers' placement rule (for checkpoint import)."""
    if sparse_step <= 0:
        return ()
    return tuple(i for i in range(num_layers) if i % sparse_step == 1 or sparse_step == 1)


def _check_rate(name, value):
    if not is_number(value) or not 0.0 <= value < 1.0:
        raise ValueError(f"`{name}` must be a number in [0, 1), got {value!r}.")


@dataclasses.dataclass
class T5Config:
    """Architecture of a T5.1.1-style encoder-decoder with optional MoE layers.

    Args:
        vocab_size: vocabulary size (shared input embedding).
        d_model: model width.
        num_heads: attention heads.
        d_ff: hidden size of the dense FFNs.
        num_encoder_layers: encoder layers (>= 1).
        num_decoder_layers: decoder layers (>= 1).
        d_kv: size of one attention head; None means `d_model // num_heads`
            (then `num_heads` must divide `d_model`).
        activation: FFN activation, one of `keras_moe.ffn.ACTIVATIONS`
            ("gated-gelu" for T5.1.1, "relu" for T5 v1.0 / Switch).
        dropout_rate: dropout after embeddings, on attention weights, in the
            FFN hidden layer and on each residual branch.
        layer_norm_epsilon: RMS norm epsilon.
        relative_attention_num_buckets: buckets of the relative position bias.
        relative_attention_max_distance: distance of the last log bucket.
        tie_word_embeddings: project the output with the input embedding
            (T5 v1.0); the decoder output is then scaled by `d_model ** -0.5`
            first. False (T5.1.1) uses a separate `lm_head`.
        scale_decoder_outputs: multiply the decoder output by
            `d_model ** -0.5` before the logits; None follows
            `tie_word_embeddings` (T5 v1.0 behaviour). Only needed for
            checkpoints that tie without scaling (HF transformers >= 5 T5).
        moe_type: None (dense model), "switch" (top-1) or "gshard" (top-2).
        num_experts: experts per MoE layer.
        expert_d_ff: hidden size of each expert (defaults to `d_ff`).
        expert_activation: activation of the experts (defaults to `activation`).
        encoder_sparse_step, decoder_sparse_step: every `step`-th layer is
            sparse (see the module docstring for the exact rule); 0 = none.
        encoder_sparse_layers, decoder_sparse_layers: explicit 0-based sparse
            layer indices; override the steps when given.
        init_scale: variance scale of every weight's init (attention, FFNs,
            experts, router, embeddings, output head): std
            `sqrt(init_scale / fan_in)`, embeddings `sqrt(init_scale)`. 1.0 is
            T5's init; the Switch paper uses 0.1 for the whole model. One
            scale for everything keeps the MoE branch as loud as the dense
            layers around it.
        router_init_scale: the routers' init scale; None follows `init_scale`.
        train_capacity_factor, eval_capacity_factor, min_expert_capacity,
        group_size, jitter_noise, expert_dropout_rate,
        aux_loss_factor, z_loss_factor, dispatch: passed to the MoE layers
            (see `keras_moe.SwitchFeedForward`; `group_size` "batch" routes
            each replica's batch as one group; `dispatch="dropless"` drops
            nothing and ignores the capacity factors, see `keras_moe.MoeLayer`).
        router_bias: give the router a bias (HF `router_bias`).
        router_dtype: dtype policy of the Switch router: "float32" (default, the
            Switch paper's selective precision, also under mixed_bfloat16),
            "bfloat16" or "mixed_bfloat16" (for stability experiments only).
        track_router_metrics: keep router-statistic trackers in MoE layers
            (TensorFlow backend only).
        pad_id, eos_id, decoder_start_id: special token ids (T5: 0, 1, 0).

    Example:
    >>> config = T5Config(vocab_size=100, d_model=32, num_heads=4, d_ff=64,
    ...     num_encoder_layers=2, num_decoder_layers=2, moe_type="switch",
    ...     num_experts=4, encoder_sparse_step=2, decoder_sparse_step=2)
    >>> config.resolved_encoder_sparse_layers()
    (1,)
    """

    vocab_size: int = 32128
    d_model: int = 768
    num_heads: int = 12
    d_ff: int = 2048
    num_encoder_layers: int = 12
    num_decoder_layers: int = 12
    d_kv: Optional[int] = 64
    activation: str = "gated-gelu"
    dropout_rate: float = 0.0
    layer_norm_epsilon: float = 1e-6
    relative_attention_num_buckets: int = 32
    relative_attention_max_distance: int = 128
    tie_word_embeddings: bool = False
    scale_decoder_outputs: Optional[bool] = None
    moe_type: Optional[str] = None
    num_experts: int = 0
    expert_d_ff: Optional[int] = None
    expert_activation: Optional[str] = None
    encoder_sparse_step: int = 0
    decoder_sparse_step: int = 0
    encoder_sparse_layers: Optional[Sequence[int]] = None
    decoder_sparse_layers: Optional[Sequence[int]] = None
    train_capacity_factor: float = 1.25
    eval_capacity_factor: float = 2.0
    min_expert_capacity: int = 4
    group_size: Union[str, int, None] = "batch"
    jitter_noise: float = 0.0
    expert_dropout_rate: float = 0.0
    init_scale: float = 1.0
    router_init_scale: Optional[float] = None
    aux_loss_factor: float = 1e-2
    z_loss_factor: float = 1e-3
    dispatch: str = "auto"
    router_bias: bool = False
    router_dtype: str = "float32"
    track_router_metrics: bool = False
    pad_id: int = 0
    eos_id: int = 1
    decoder_start_id: int = 0

    def __post_init__(self):
        for name in ("vocab_size", "d_model", "num_heads", "d_ff", "num_encoder_layers",
                     "num_decoder_layers", "relative_attention_num_buckets",
                     "relative_attention_max_distance"):
            check_int(name, getattr(self, name), 1)
        if self.d_kv is None:
            if self.d_model % self.num_heads:
                raise ValueError(
                    f"`num_heads` ({self.num_heads}) must divide `d_model` ({self.d_model}) "
                    "when `d_kv` is not given; set `d_kv` explicitly."
                )
        else:
            check_int("d_kv", self.d_kv, 1)
        if self.activation not in ACTIVATIONS:
            raise ValueError(f"`activation` must be one of {ACTIVATIONS}, got {self.activation!r}.")
        if self.expert_activation is not None and self.expert_activation not in ACTIVATIONS:
            raise ValueError(
                f"`expert_activation` must be None or one of {ACTIVATIONS}, "
                f"got {self.expert_activation!r}."
            )
        _check_rate("dropout_rate", self.dropout_rate)
        for name in ("init_scale", "router_init_scale"):
            value = getattr(self, name)
            if value is None and name == "router_init_scale":
                continue
            if not is_number(value) or not value > 0:
                raise ValueError(f"`{name}` must be a number > 0, got {value!r}.")
        if self.group_size is not None and self.group_size not in GROUPINGS and (
                isinstance(self.group_size, bool) or not isinstance(self.group_size, int)
                or self.group_size < 1):
            raise ValueError(f"`group_size` must be one of {GROUPINGS}, None or an integer "
                             f">= 1, got {self.group_size!r}.")
        _check_rate("expert_dropout_rate", self.expert_dropout_rate)
        if self.router_dtype not in ROUTER_DTYPES:
            raise ValueError(
                f"`router_dtype` must be one of {ROUTER_DTYPES}, got {self.router_dtype!r}.")
        if self.moe_type is not None and self.moe_type not in MOE_TYPES:
            raise ValueError(f"`moe_type` must be None or one of {MOE_TYPES}, got {self.moe_type!r}.")
        if self.dispatch not in DISPATCH_MODES:
            raise ValueError(f"`dispatch` must be one of {DISPATCH_MODES}, got {self.dispatch!r}.")
        for name in ("encoder_sparse_step", "decoder_sparse_step"):
            check_int(name, getattr(self, name), 0)
        if self.expert_d_ff is not None:
            check_int("expert_d_ff", self.expert_d_ff, 1)
        for side, num in (("encoder", self.num_encoder_layers), ("decoder", self.num_decoder_layers)):
            name = f"{side}_sparse_layers"
            layers = getattr(self, name)
            if layers is None:
                continue
            layers = list(layers)
            for i in layers:
                if not is_int(i) or not 0 <= i < num:
                    raise ValueError(
                        f"`{name}` entries must be layer indices in [0, {num}), got {i!r}."
                    )
            if len(set(layers)) != len(layers):
                raise ValueError(f"`{name}` has duplicate layer indices: {layers}.")
            setattr(self, name, tuple(sorted(layers)))
        has_sparse = bool(self.resolved_encoder_sparse_layers()
                          or self.resolved_decoder_sparse_layers())
        if has_sparse:
            if self.moe_type is None:
                raise ValueError(
                    "`moe_type` must be 'switch' or 'gshard' when sparse layers are configured "
                    "(sparse steps or sparse layer lists), got None."
                )
            minimum = 2 if self.moe_type == "gshard" else 1
            check_int("num_experts", self.num_experts, minimum)

    @property
    def scales_decoder_outputs(self):
        if self.scale_decoder_outputs is None:
            return bool(self.tie_word_embeddings)
        return bool(self.scale_decoder_outputs)

    @property
    def head_dim(self):
        return self.d_kv if self.d_kv is not None else self.d_model // self.num_heads

    def resolved_encoder_sparse_layers(self):
        if self.encoder_sparse_layers is not None:
            return tuple(self.encoder_sparse_layers)
        return sparse_layers_from_step(self.num_encoder_layers, self.encoder_sparse_step)

    def resolved_decoder_sparse_layers(self):
        if self.decoder_sparse_layers is not None:
            return tuple(self.decoder_sparse_layers)
        return sparse_layers_from_step(self.num_decoder_layers, self.decoder_sparse_step)

    def to_dict(self):
        out = dataclasses.asdict(self)
        for key in ("encoder_sparse_layers", "decoder_sparse_layers"):
            if out[key] is not None:
                out[key] = list(out[key])
        return out

    @classmethod
    def from_dict(cls, values):
        return cls(**values)

    def replace(self, **changes):
        return dataclasses.replace(self, **changes)


def count_params(config):
    """Number of weights of `EncoderDecoder(config)`, computed without building it.

    Example:
    >>> count_params(T5Config())  # T5.1.1-base
    247577856
    """
    d, h, dk, v = config.d_model, config.num_heads, config.head_dim, config.vocab_size
    attention = 4 * d * h * dk
    gated = config.activation.startswith("gated-")
    dense_ffn = (3 if gated else 2) * d * config.d_ff
    expert_act = config.expert_activation or config.activation
    expert_ffn = (3 if expert_act.startswith("gated-") else 2) * d * (config.expert_d_ff or config.d_ff)
    sparse_ffn = config.num_experts * expert_ffn + d * config.num_experts
    if config.router_bias:
        sparse_ffn += config.num_experts
    total = v * d  # shared embedding
    if not config.tie_word_embeddings:
        total += d * v
    bias = config.relative_attention_num_buckets * h
    enc_sparse = set(config.resolved_encoder_sparse_layers())
    dec_sparse = set(config.resolved_decoder_sparse_layers())
    total += bias + d  # encoder position bias + final norm
    for i in range(config.num_encoder_layers):
        total += attention + 2 * d + (sparse_ffn if i in enc_sparse else dense_ffn)
    total += bias + d
    for i in range(config.num_decoder_layers):
        total += 2 * attention + 3 * d + (sparse_ffn if i in dec_sparse else dense_ffn)
    return total
