"""`T5Config`: the architecture of a T5.1.1 / Switch / GShard encoder-decoder.

A plain dataclass, so the library is usable without gin; `model_configurables`
registers it for gin files. It is the builder's recipe: `keras_moe.models.ffn_factories`
turns it into the blocks' arguments and FFN layers. All validation happens in
`__post_init__`, once, by reading the fields and the sparse FFN's arguments
(no layer is built), so a bad config fails before any weight is created.

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
from typing import Any, List, Optional, Sequence

from keras_moe.arguments import check_values
from keras_moe.models import flat_moe_fields
from keras_moe.models import sparse_ffn as sparse_ffn_lib
from keras_moe.validation import check_int, is_int

SIDES = ("encoder", "decoder")


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
        activation: FFN activation, one of `keras_moe.arguments.ACTIVATIONS`
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
        sparse_ffn: the MoE layer of the sparse layers (see
            `keras_moe.models.sparse_ffn`): a factory such as
            `functools.partial(SwitchFeedForward, num_experts=8, d_ff=2048)`
            or gin's `@SwitchFeedForward`, an unbuilt template layer, or its
            spec dict. Kept as the spec dict; the config reads its arguments
            (`SparseFfnSpec.check`: names, `num_experts`, `d_ff`, `activation`,
            a causal-safe router for the decoder) and the layer checks the rest
            (routing, capacity, grouping, losses, dispatch) when the model
            builds it. None: a dense model.
        encoder_sparse_ffn, decoder_sparse_ffn: a stack's own sparse FFN
            (e.g. batch-prioritized routing in the encoder only); None uses
            `sparse_ffn`.
        encoder_sparse_step, decoder_sparse_step: every `step`-th layer is
            sparse (see the module docstring for the exact rule); 0 = none.
        encoder_sparse_layers, decoder_sparse_layers: explicit 0-based sparse
            layer indices; override the steps when given.
        init_scale: variance scale of the dense weights' init (attention,
            FFNs, embeddings, output head): std `sqrt(init_scale / fan_in)`,
            embeddings `sqrt(init_scale)`. 1.0 is T5's init; the Switch paper
            uses 0.1 for the whole model (give the sparse FFN the same
            `init_scale`).
        track_router_metrics: log the MoE layers' router statistics in `fit`
            and `evaluate` (`<layer>/ffn/dropped_fraction`, ...), on TensorFlow
            and JAX.
        pad_id, eos_id, decoder_start_id: special token ids (T5: 0, 1, 0).

    Example:
    >>> import functools
    >>> from keras_moe import SwitchFeedForward
    >>> config = T5Config(vocab_size=100, d_model=32, num_heads=4, d_ff=64,
    ...     num_encoder_layers=2, num_decoder_layers=2, encoder_sparse_step=2,
    ...     decoder_sparse_step=2,
    ...     sparse_ffn=functools.partial(SwitchFeedForward, num_experts=4, d_ff=64))
    >>> config.resolved_encoder_sparse_layers(), config.num_experts
    ((1,), 4)
    >>> config.sparse_ffn["class_name"]
    'keras_moe>SwitchFeedForward'
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
    sparse_ffn: Any = None
    encoder_sparse_ffn: Any = None
    decoder_sparse_ffn: Any = None
    encoder_sparse_step: int = 0
    decoder_sparse_step: int = 0
    encoder_sparse_layers: Optional[Sequence[int]] = None
    decoder_sparse_layers: Optional[Sequence[int]] = None
    init_scale: float = 1.0
    track_router_metrics: bool = False
    pad_id: int = 0
    eos_id: int = 1
    decoder_start_id: int = 0

    def __post_init__(self):
        for name in (
            "vocab_size",
            "d_model",
            "num_heads",
            "d_ff",
            "num_encoder_layers",
            "num_decoder_layers",
            "relative_attention_num_buckets",
            "relative_attention_max_distance",
        ):
            check_int(name, getattr(self, name), 1)
        if self.d_kv is None:
            if self.d_model % self.num_heads:
                raise ValueError(
                    f"`num_heads` ({self.num_heads}) must divide `d_model` ({self.d_model}) "
                    "when `d_kv` is not given; set `d_kv` explicitly."
                )
        else:
            check_int("d_kv", self.d_kv, 1)
        # The same rules as the layers' arguments of these names.
        check_values(
            dict(
                activation=self.activation,
                dropout_rate=self.dropout_rate,
                init_scale=self.init_scale,
            )
        )
        for name in ("encoder_sparse_step", "decoder_sparse_step"):
            check_int(name, getattr(self, name), 0)
        nums = (self.num_encoder_layers, self.num_decoder_layers)
        for side, num in zip(SIDES, nums, strict=False):
            self._check_sparse_layers(f"{side}_sparse_layers", num)
        self._normalize_sparse_ffns()

    def _check_sparse_layers(self, name, num):
        layers = getattr(self, name)
        if layers is None:
            return
        layers = list(layers)
        for i in layers:
            if not is_int(i) or not 0 <= i < num:
                raise ValueError(
                    f"`{name}` entries must be layer indices in [0, {num}), got {i!r}."
                )
        if len(set(layers)) != len(layers):
            raise ValueError(f"`{name}` has duplicate layer indices: {layers}.")
        setattr(self, name, tuple(sorted(layers)))

    def _normalize_sparse_ffns(self):
        if self.sparse_ffn is not None:
            # The decoder's layers are causal: validate the shared spec as such
            # when the decoder uses it.
            uses = self.decoder_sparse_ffn is None and self.resolved_decoder_sparse_layers()
            self.sparse_ffn = sparse_ffn_lib.normalize_spec(self.sparse_ffn, causal=bool(uses))
        for side, causal in zip(SIDES, (False, True), strict=False):
            name = f"{side}_sparse_ffn"
            if getattr(self, name) is not None:
                setattr(self, name, sparse_ffn_lib.normalize_spec(getattr(self, name), causal))
            if self._sparse_layers(side) and self.sparse_ffn_spec(side) is None:
                raise ValueError(
                    f"`sparse_ffn` (or `{name}`) must be given when the {side} has sparse "
                    "layers (sparse steps or sparse layer lists), got None."
                )

    def _sparse_layers(self, side):
        if side == "encoder":
            return self.resolved_encoder_sparse_layers()
        return self.resolved_decoder_sparse_layers()

    def sparse_ffn_spec(self, side: str) -> Optional[dict]:
        """The spec dict of `side`'s ("encoder" / "decoder") sparse layers, or None."""
        own = getattr(self, f"{side}_sparse_ffn")
        return own if own is not None else self.sparse_ffn

    def sparse_ffn_view(self, side: str) -> Optional[sparse_ffn_lib.SparseFfnSpec]:
        """The typed view (`SparseFfnSpec`) of `side`'s sparse FFN, or None."""
        spec = self.sparse_ffn_spec(side)
        return None if spec is None else sparse_ffn_lib.SparseFfnSpec.from_dict(spec)

    def used_sparse_ffn_specs(self) -> List[dict]:
        """The specs of the stacks that have sparse layers."""
        return [self.required_sparse_ffn_spec(side) for side in SIDES if self._sparse_layers(side)]

    def required_sparse_ffn_spec(self, side: str) -> dict:
        """The spec dict of `side`'s sparse layers, for a stack that has some."""
        spec = self.sparse_ffn_spec(side)
        if spec is None:
            raise ValueError(f"the {side} has sparse layers but no `sparse_ffn` to make them of.")
        return spec

    def _used_views(self):
        return [self.sparse_ffn_view(side) for side in SIDES if self._sparse_layers(side)]

    def sparse_option(self, name: str, default: Any = None) -> Any:
        """An argument of the sparse FFN (the encoder's if the stacks differ), or
        `default` for a dense model, e.g. `config.sparse_option("group_size")`."""
        views = self._used_views()
        if not views:
            return default
        return views[0].get(name)

    def make_sparse_ffn(self, side: str, name: str, metrics_prefix: Optional[str] = None):
        """A new sparse FFN layer for `side` ("encoder" / "decoder")."""
        spec = sparse_ffn_lib.SparseFfnSpec.from_dict(self.required_sparse_ffn_spec(side))
        return spec.make_layer(
            name,
            causal=side == "decoder",
            track_metrics=self.track_router_metrics,
            metrics_prefix=metrics_prefix,
        )

    @property
    def is_sparse(self) -> bool:
        """Whether any layer is a MoE layer."""
        return bool(self.used_sparse_ffn_specs())

    @property
    def num_experts(self) -> int:
        """Experts per MoE layer (the most of the two stacks); 0 for a dense model."""
        return max((view.num_experts for view in self._used_views()), default=0)

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
        """The config of `to_dict()`'s output, also of one saved with the flat MoE
        fields that the sparse-FFN spec replaced (see `upgrade_flat_moe_fields`)."""
        return cls(**upgrade_flat_moe_fields(values))

    def replace(self, **changes):
        return dataclasses.replace(self, **changes)


def _has_sparse_layers(values):
    fields = {f.name: f.default for f in dataclasses.fields(T5Config)}
    fields.update(values)
    for side in SIDES:
        layers = fields[f"{side}_sparse_layers"]
        num, step = fields[f"num_{side}_layers"], fields[f"{side}_sparse_step"]
        if layers is not None:
            if len(layers):
                return True
        elif not (is_int(num) and is_int(step)) or sparse_layers_from_step(num, step):
            return True  # an invalid count: T5Config names it
    return False


def upgrade_flat_moe_fields(values):
    """`T5Config` fields with the flat MoE fields of a config from before the
    sparse-FFN spec (`moe_type`, `num_experts`, `aux_loss_factor`, ...; see
    `flat_moe_fields.FLAT_FIELDS`) replaced by the `sparse_ffn` spec they made.

    A model without sparse layers gets no spec, whatever MoE fields it carries
    (a dense config then could hold `moe_type="switch"` with `num_experts=0`).
    Used for saved JSON configs (`T5Config.from_dict`) and for gin files
    (`keras_moe.gin_config.flat_moe_gin`).

    Args:
        values: a dict of `T5Config` fields, maybe with flat MoE fields.

    Returns:
        a new dict without the flat fields; with `sparse_ffn` when it had any.

    Raises:
        ValueError: the flat fields together with a sparse FFN spec.

    Example:
    >>> old = dict(d_ff=64, activation="relu", encoder_sparse_step=2, moe_type="switch",
    ...            num_experts=4, aux_loss_factor=0.01)
    >>> new = upgrade_flat_moe_fields(old)
    >>> sorted(new), new["sparse_ffn"]["class_name"]
    (['activation', 'd_ff', 'encoder_sparse_step', 'sparse_ffn'], 'keras_moe>SwitchFeedForward')
    >>> upgrade_flat_moe_fields(dict(moe_type="switch", num_experts=0))  # dense
    {'sparse_ffn': None}
    """
    values = dict(values)
    flat = [name for name in flat_moe_fields.FLAT_FIELDS if name in values]
    if not flat:
        return values
    given = [
        f"{side}sparse_ffn"
        for side in ("", "encoder_", "decoder_")
        if values.get(f"{side}sparse_ffn") is not None
    ]
    if given:
        raise ValueError(
            f"the config has both `{given[0]}` and the flat MoE fields {flat} "
            "that `sparse_ffn` replaced; give the sparse FFN's arguments in its "
            "spec only."
        )
    if _has_sparse_layers(values):
        values["sparse_ffn"] = flat_moe_fields.spec_from_flat_fields(values)
    else:
        for name in flat:
            del values[name]
        values["sparse_ffn"] = None
    return values


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
    total = v * d  # shared embedding
    if not config.tie_word_embeddings:
        total += d * v
    bias = config.relative_attention_num_buckets * h
    enc_sparse = set(config.resolved_encoder_sparse_layers())
    dec_sparse = set(config.resolved_decoder_sparse_layers())
    sparse_ffn = {
        side: spec and sparse_ffn_lib.count_sparse_ffn_params(spec, d)
        for side in ("encoder", "decoder")
        for spec in [config.sparse_ffn_spec(side)]
    }
    total += bias + d  # encoder position bias + final norm
    for i in range(config.num_encoder_layers):
        total += attention + 2 * d + (sparse_ffn["encoder"] if i in enc_sparse else dense_ffn)
    total += bias + d
    for i in range(config.num_decoder_layers):
        total += 2 * attention + 3 * d + (sparse_ffn["decoder"] if i in dec_sparse else dense_ffn)
    return total
