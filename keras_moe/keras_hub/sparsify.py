"""`sparsify(model)`: a keras-hub MoE model whose MoE blocks are keras_moe layers.

keras-hub's MoE blocks run every expert on every token; `sparsify` replaces each
with a `SparseMoeBlock` (a `MoeLayer`: the family's router, its experts as
`FeedForwardExperts`, its shared expert) holding the same weights, so each
token reaches only its k experts. The model keeps its class in the `isinstance`
sense (a registered subclass that saves and loads as sparse), its
preprocessor, sampler, `generate`, `fit` and `save`.
"""

from __future__ import annotations

import importlib
from typing import Any

import keras
import keras_hub

from keras_moe import arguments
from keras_moe.keras_hub import families as families_lib
from keras_moe.keras_hub.sparse_block import SparseMoeBlock
from keras_moe.layers.experts import FeedForwardExperts
from keras_moe.layers.moe import MoeLayer
from keras_moe.layers.shared_experts import SharedExpertFeedForward
from keras_moe.routing import TopKRouter
from keras_moe.routing.metrics import RouterMetricsMixin

_OPTIONS_KEY = "keras_moe_sparse"


def _keras_hub_class(name: str) -> type | None:
    return getattr(keras_hub.models, name, None)


def _block_class(family: families_lib.Family) -> type[keras.layers.Layer]:
    return getattr(importlib.import_module(family.module), family.block_class)


def _make_sparse_block_class(family: families_lib.Family) -> type:
    # A subclass of the family's block too: keras-hub's Qwen decoders pass the
    # attention mask and `training` only to an instance of their block class.
    return keras.saving.register_keras_serializable(package="keras_moe")(
        type(f"Sparse{family.name}Block", (SparseMoeBlock, _block_class(family)), {})
    )


def _make_sparse_backbone_class(family: families_lib.Family, base: type) -> type:
    def get_config(self):
        config = base.get_config(self)
        config[_OPTIONS_KEY] = dict(self._keras_moe_options)
        return config

    def from_config(cls, config):
        config = dict(config)
        options = config.pop(_OPTIONS_KEY, {})
        return sparsify(base.from_config(config), **options)

    doc = (
        f"keras-hub's `{base.__name__}` with keras_moe MoE blocks (`keras_moe.sparsify`); "
        "it saves and loads as sparse."
    )
    return keras.saving.register_keras_serializable(package="keras_moe")(
        type(
            f"Sparse{base.__name__}",
            (base,),
            {"get_config": get_config, "from_config": classmethod(from_config), "__doc__": doc},
        )
    )


def _make_sparse_task_class(base: type, backbone_cls: type) -> type:
    doc = (
        f"keras-hub's `{base.__name__}` over a sparsified backbone, with router metrics "
        "in `fit` and `evaluate` on every backend."
    )
    # `backbone_cls`: keras-hub's `from_preset` finds this class for a preset saved sparse.
    return keras.saving.register_keras_serializable(package="keras_moe")(
        type(
            f"Sparse{base.__name__}",
            (RouterMetricsMixin, base),
            {"__doc__": doc, "backbone_cls": backbone_cls},
        )
    )


class _Registry:
    """The families the installed keras-hub has, with their sparse classes."""

    def __init__(self) -> None:
        self.by_backbone: dict[type, families_lib.Family] = {}
        self.sparse_backbone: dict[type, type] = {}
        self.sparse_task: dict[type, type] = {}
        self.sparse_block: dict[str, type] = {}
        for family in families_lib.FAMILIES:
            backbone = _keras_hub_class(f"{family.name}Backbone")
            if backbone is None:
                continue
            self.by_backbone[backbone] = family
            self.sparse_backbone[backbone] = _make_sparse_backbone_class(family, backbone)
            self.sparse_block[family.name] = _make_sparse_block_class(family)
            task = _keras_hub_class(f"{family.name}CausalLM")
            if task is not None:
                self.sparse_task[task] = _make_sparse_task_class(
                    task, self.sparse_backbone[backbone]
                )


REGISTRY = _Registry()


def check_options(
    dispatch: Any,
    aux_loss_factor: Any,
    bias_update_rate: Any,
    train_capacity_factor: Any,
    eval_capacity_factor: Any,
    dropless_buffer_factor: Any = None,
) -> None:
    """Refuses a bad option by the MoE layers' own rules (`keras_moe.arguments`);
    `aux_loss_factor=None` keeps the family's own coefficient."""
    options = dict(
        dispatch=dispatch,
        bias_update_rate=bias_update_rate,
        train_capacity_factor=train_capacity_factor,
        eval_capacity_factor=eval_capacity_factor,
        dropless_buffer_factor=dropless_buffer_factor,
    )
    if aux_loss_factor is not None:
        options["aux_loss_factor"] = aux_loss_factor
    arguments.check_values(options)
    arguments.check_dropless_buffer_factor(dispatch, dropless_buffer_factor)


def _describe(model: Any) -> str:
    return f"a {type(model).__module__}.{type(model).__name__}"


def _backbone_family(backbone: Any, given: Any) -> families_lib.Family:
    if type(backbone) in REGISTRY.sparse_backbone.values():
        raise ValueError(
            f"`model` is already sparse ({type(backbone).__name__}): "
            "`keras_moe.sparsify` takes a keras-hub MoE model once."
        )
    family = REGISTRY.by_backbone.get(type(backbone))
    if family is not None:
        return family
    name = type(backbone).__name__.removesuffix("Backbone")
    if name in families_lib.UNSUPPORTED:
        raise ValueError(
            f"`model` is keras-hub's {name} family, which `keras_moe.sparsify` "
            f"does not support: {families_lib.UNSUPPORTED[name]}."
        )
    supported = ", ".join(f.name for f in REGISTRY.by_backbone.values())
    raise ValueError(
        f"`model` must be a keras-hub MoE Backbone or CausalLM of a supported "
        f"family ({supported}), got {_describe(given)}."
    )


def _new_moe_layer(
    weights: families_lib.BlockWeights, options: dict[str, Any], dtype: Any, metrics_prefix: str
) -> MoeLayer:
    router_args = dict(weights.router_args)
    if options["bias_update_rate"] > 0:
        router_args.update(selection_bias=True, bias_update_rate=options["bias_update_rate"])
    router = TopKRouter(**router_args, name="router")
    experts = FeedForwardExperts(**weights.experts_args, name="experts", dtype=dtype)
    shared = None
    if weights.shared_args is not None:
        shared = SharedExpertFeedForward(**weights.shared_args, name="shared_expert", dtype=dtype)
    aux = options["aux_loss_factor"]
    return MoeLayer(
        router,
        experts,
        shared_experts=shared,
        dispatch=options["dispatch"],
        train_capacity_factor=options["train_capacity_factor"],
        eval_capacity_factor=options["eval_capacity_factor"],
        aux_loss_factor=weights.aux_loss_factor if aux is None else aux,
        dropless_buffer_factor=options["dropless_buffer_factor"],
        balance_loss="global",
        z_loss_factor=0.0,
        losses_in_inference=False,
        causal=True,
        track_metrics=options["track_metrics"],
        metrics_prefix=metrics_prefix,
        name="moe",
        dtype=dtype,
    )


def _assign(layer: keras.layers.Layer, values: dict[str, Any]) -> None:
    for name, value in values.items():
        if value is not None:  # None: a model of shapes only, built to compile
            getattr(layer, name).assign(value)


def _replace_block(
    decoder: keras.layers.Layer, family: families_lib.Family, options: dict[str, Any]
) -> bool:
    old = getattr(decoder, family.block_attribute, None)
    if not isinstance(old, _block_class(family)):
        return False  # a dense FFN layer (Qwen's mlp_only_layers, decoder_sparse_step)
    weights = family.read_block(old)
    moe = _new_moe_layer(weights, options, old.dtype_policy, metrics_prefix=decoder.name)
    block = REGISTRY.sparse_block[family.name](moe, name=old.name, dtype=old.dtype_policy)
    block.build((None, None, old.hidden_dim))
    _assign(moe.router, weights.router)
    _assign(moe.experts, weights.experts)
    if weights.shared is not None:
        _assign(moe.shared_experts, weights.shared)
    # Move, not copy: the decoder stops tracking the old block, whose variables go with it.
    tracker = decoder._tracker
    locked = tracker.locked
    tracker.unlock()
    tracker.replace_tracked_value("layers", old, block)
    setattr(decoder, family.block_attribute, block)
    if locked:
        tracker.lock()
    return True


def sparsify(
    model: Any,
    dispatch: arguments.DispatchMode = "dropless",
    aux_loss_factor: float | None = None,
    bias_update_rate: float = 0.0,
    train_capacity_factor: float = 1.25,
    eval_capacity_factor: float = 2.0,
    track_metrics: bool = True,
    dropless_buffer_factor: float | None = None,
) -> Any:
    """Replaces a keras-hub MoE model's MoE blocks by keras_moe layers, in place.

    Each MoE block of the backbone becomes a `SparseMoeBlock`: a `MoeLayer` with
    a `TopKRouter` scoring as the family does (softmax top-k, renormalised for
    Mixtral, gpt-oss and where Qwen's `norm_top_k_prob` says so; gpt-oss's
    router bias), the experts as `FeedForwardExperts` (SwiGLU; gpt-oss's
    biases and clamped SwiGLU) and Qwen-MoE's gated shared expert, holding the
    block's weights (moved: the dense block is dropped). Each token then runs
    only its k experts. The family's load-balancing loss is added in training
    (keras-hub's per-layer form: `E * sum_e f_e P_e`, `f` over all k choices of
    the real tokens), and router metrics reach `fit`'s history.

    Supported families: Mixtral, QwenMoe, Qwen3Moe and GptOss (Backbone or
    CausalLM). Anything else, or a model sparsified already, is refused.

    Args:
        model: a keras-hub `Backbone` or `CausalLM` of a supported family.
            Sparsify before `compile`; the model is changed in place.
        dispatch: "dropless" (default: no token is ever dropped), or a
            capacity dispatch of `keras_moe.MoeLayer` ("gather", "einsum",
            "auto"), which drops tokens past each expert's capacity.
        aux_loss_factor: the load-balancing loss weight; None (default): the
            family's own (`router_aux_loss_coef`; 0 for gpt-oss, whose
            keras-hub block has none).
        bias_update_rate: > 0 turns on loss-free balancing (a per-expert
            selection bias moved by this step in every training call).
        train_capacity_factor, eval_capacity_factor: capacity per expert for
            the capacity dispatches, > 0.
        track_metrics: keep router metrics (`<decoder layer>/<statistic>`).
        dropless_buffer_factor: with dropless dispatch and the experts split
            over a JAX mesh: each device's receive buffer in multiples of its
            own token-expert assignments (rows past it are dropped and
            counted); None (default): the worst case, nothing dropped
            (`keras_moe.MoeLayer`).

    Returns:
        `model`, now sparse: an instance of its class (a registered subclass
        `Sparse<Class>` that saves and loads as sparse once `keras_moe.keras_hub`
        is imported).

    Example:
    >>> import keras_hub
    >>> import numpy as np
    >>> import keras_moe
    >>> backbone = keras_hub.models.Qwen3MoeBackbone(
    ...     vocabulary_size=64, num_layers=1, num_query_heads=2, num_key_value_heads=1,
    ...     hidden_dim=16, intermediate_dim=32, moe_intermediate_dim=8, head_dim=8,
    ...     num_experts=8, top_k=2, norm_top_k_prob=True)
    >>> inputs = {"token_ids": np.array([[1, 2, 3]]), "padding_mask": np.ones((1, 3))}
    >>> dense_outputs = np.asarray(backbone(inputs))
    >>> backbone = keras_moe.sparsify(backbone)
    >>> isinstance(backbone, keras_hub.models.Qwen3MoeBackbone)
    True
    >>> bool(np.allclose(backbone(inputs), dense_outputs, atol=1e-5))
    True
    """
    check_options(
        dispatch,
        aux_loss_factor,
        bias_update_rate,
        train_capacity_factor,
        eval_capacity_factor,
        dropless_buffer_factor,
    )
    options = dict(
        dispatch=dispatch,
        aux_loss_factor=aux_loss_factor,
        dropless_buffer_factor=dropless_buffer_factor,
        bias_update_rate=float(bias_update_rate),
        train_capacity_factor=float(train_capacity_factor),
        eval_capacity_factor=float(eval_capacity_factor),
        track_metrics=bool(track_metrics),
    )
    is_task = isinstance(model, keras_hub.models.CausalLM)
    if not is_task and not isinstance(model, keras_hub.models.Backbone):
        raise ValueError(
            "`model` must be a keras-hub Backbone or CausalLM of an MoE family, "
            f"got {_describe(model)}."
        )
    backbone = model.backbone if is_task else model
    family = _backbone_family(backbone, model)
    decoders = list(getattr(backbone, "transformer_layers", []))
    replaced = [_replace_block(decoder, family, options) for decoder in decoders]
    if not any(replaced):
        raise ValueError(f"`model` ({type(backbone).__name__}) has no MoE block to sparsify.")
    backbone.__class__ = REGISTRY.sparse_backbone[type(backbone)]
    backbone._keras_moe_options = options
    if is_task and type(model) in REGISTRY.sparse_task:
        model.__class__ = REGISTRY.sparse_task[type(model)]
    _forget_compiled_functions(model)
    return model


def _forget_compiled_functions(model: Any) -> None:
    """Functions traced before the blocks changed would run the dense blocks."""
    for name in ("train_function", "test_function", "predict_function", "generate_function"):
        if getattr(model, name, None) is not None:
            setattr(model, name, None)


def is_sparse(model: Any) -> bool:
    """Whether `model` (a keras-hub Backbone or CausalLM) was sparsified."""
    backbone = getattr(model, "backbone", model)
    return type(backbone) in REGISTRY.sparse_backbone.values()
