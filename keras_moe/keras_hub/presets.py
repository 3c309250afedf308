"""`from_preset`: keras-hub's `from_preset` for MoE checkpoints, then `sparsify`.

It also reads what keras-hub 0.32's converters do not:
- Hugging Face config files written by transformers v5, which spell fields
  differently from the published checkpoints (`num_local_experts` for
  `num_experts`, `rope_parameters` for `rope_theta` / `rope_scaling`);
- gpt-oss checkpoints with plain expert tensors (`experts.gate_up_proj`,
  `experts.down_proj`: fine-tuned and dequantized ones) besides the MXFP4
  `*_blocks` / `*_scales` of the published ones.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import keras_hub
import numpy as np
from keras_hub.src.utils import preset_utils
from keras_hub.src.utils.transformers.preset_loader import TransformersPresetLoader
from keras_hub.src.utils.transformers.safetensor_utils import SafetensorLoader

from keras_moe.arguments import DispatchMode
from keras_moe.keras_hub.sparsify import check_options, is_sparse, sparsify

# transformers v5 spelling -> the spelling published checkpoints (and keras-hub 0.32) use.
_RENAMED = {"num_local_experts": "num_experts"}
_MXFP4_VALUES_PER_BLOCK = 32  # 16 bytes of two 4-bit values


def with_both_spellings(config: dict[str, Any]) -> dict[str, Any]:
    """A Hugging Face `config.json` dict with each renamed field under both names.

    Example:
    >>> rope = {"rope_theta": 1e6, "rope_type": "default"}
    >>> config = with_both_spellings({"num_local_experts": 8, "rope_parameters": rope})
    >>> config["num_experts"], config["rope_theta"], config.get("rope_scaling")
    (8, 1000000.0, None)
    """
    config = dict(config)
    for new, old in _RENAMED.items():
        if new in config and old not in config:
            config[old] = config[new]
        elif old in config and new not in config:
            config[new] = config[old]
    rope = config.get("rope_parameters") or {}
    if "rope_theta" not in config and "rope_theta" in rope:
        config["rope_theta"] = rope["rope_theta"]
    if config.get("rope_scaling") is None and rope.get("rope_type", "default") != "default":
        config["rope_scaling"] = {k: v for k, v in rope.items() if k != "rope_theta"}
    return config


class _Discard:
    """Stands for a variable whose value is set later: `assign` does nothing."""

    def assign(self, value: Any) -> None:
        pass


_PLAIN_EXPERT_TENSORS = ("gate_up_proj", "down_proj")


class _PlainGptOssExperts(SafetensorLoader):
    """keras-hub's gpt-oss converter reads only MXFP4 expert tensors: where the
    checkpoint holds plain ones, it is given all-zero MXFP4 tensors, its
    expert assignments are discarded (`converting`), and the plain values
    are set after it."""

    def get_tensor(self, hf_weight_key: str) -> Any:
        for suffix in ("_blocks", "_scales"):
            if hf_weight_key.endswith(suffix):
                plain = super().get_tensor(hf_weight_key.removesuffix(suffix))
                experts, inputs, outputs = plain.shape
                blocks = -(-inputs // _MXFP4_VALUES_PER_BLOCK)
                shape = (
                    (experts, outputs, blocks, 16)
                    if suffix == "_blocks"
                    else (experts, outputs, blocks)
                )
                return np.zeros(shape, "uint8")
        return super().get_tensor(hf_weight_key)

    @contextlib.contextmanager
    def converting(self, backbone: Any) -> Iterator[None]:
        """Runs keras-hub's converter with the plain expert tensors set after it."""
        banks = [decoder.sparse_moe_block.experts for decoder in backbone.transformer_layers]
        saved = [{name: getattr(bank, name) for name in _PLAIN_EXPERT_TENSORS} for bank in banks]
        for bank in banks:  # object.__setattr__: not tracked as the layer's state
            for name in _PLAIN_EXPERT_TENSORS:
                object.__setattr__(bank, name, _Discard())
        try:
            yield
        finally:
            for bank, variables in zip(banks, saved, strict=True):
                for name, variable in variables.items():
                    object.__setattr__(bank, name, variable)
        for i, bank in enumerate(banks):
            for name in _PLAIN_EXPERT_TENSORS:
                getattr(bank, name).assign(
                    super().get_tensor(f"model.layers.{i}.mlp.experts.{name}")
                )


def _has_tensor(preset: str, key: str) -> bool:
    with SafetensorLoader(preset) as loader:
        try:
            loader.get_tensor(key)
        except Exception:  # safetensors raises its own error type for a missing key
            return False
    return True


class _TransformersLoader(TransformersPresetLoader):
    """keras-hub's Hugging Face loader with both config spellings and plain gpt-oss experts."""

    def __init__(self, preset: str, config: dict[str, Any]) -> None:
        super().__init__(preset, with_both_spellings(config))

    def load_backbone(self, cls: type, load_weights: bool, **kwargs: Any) -> Any:
        plain = (
            load_weights
            and self.config["model_type"] == "gpt_oss"
            and _has_tensor(self.preset, "model.layers.0.mlp.experts.gate_up_proj")
        )
        if not plain:
            return super().load_backbone(cls, load_weights, **kwargs)
        backbone = super().load_backbone(cls, False, **kwargs)
        with _PlainGptOssExperts(self.preset) as loader, loader.converting(backbone):
            self.converter.convert_weights(backbone, loader, self.config)
        return backbone


def from_preset(
    preset: str,
    cls: type[Any] | None = None,
    load_weights: bool = True,
    sparse: bool = True,
    dispatch: DispatchMode = "dropless",
    aux_loss_factor: float | None = None,
    bias_update_rate: float = 0.0,
    train_capacity_factor: float = 1.25,
    eval_capacity_factor: float = 2.0,
    track_metrics: bool = True,
    dropless_buffer_factor: float | None = None,
    **kwargs: Any,
) -> Any:
    """Loads a keras-hub MoE model from a preset and returns it sparse (`keras_moe.sparsify`).

    Args:
        preset: what keras-hub's `from_preset` takes: a Kaggle or Hugging Face
            handle ("hf://Qwen/Qwen3-30B-A3B"), or a local folder (a Hugging
            Face checkpoint or a keras-hub preset, sparse ones included).
        cls: the keras-hub class to load as: `keras_hub.models.CausalLM`
            (default; the family's own CausalLM is picked) or a Backbone class.
        load_weights: load the checkpoint's weights (False: random ones).
        sparse: False: return keras-hub's own (dense) model, read with the
            fixes above, e.g. to compare it with the sparse one.
        dispatch, aux_loss_factor, bias_update_rate, train_capacity_factor,
            eval_capacity_factor, track_metrics, dropless_buffer_factor: as for
            `keras_moe.sparsify`
            (a preset saved sparse keeps its own).
        **kwargs: passed to keras-hub's loading (e.g. `dtype`, `preprocessor=None`).

    Returns:
        The sparse model, an instance of `cls`.

    Example (a tiny Mixtral, saved as a keras-hub preset and loaded sparse):
    >>> import tempfile
    >>> import keras_hub
    >>> import keras_moe
    >>> backbone = keras_hub.models.MixtralBackbone(
    ...     vocabulary_size=64, num_layers=1, num_query_heads=2, num_key_value_heads=1,
    ...     hidden_dim=16, intermediate_dim=32, num_experts=4, top_k=2)
    >>> folder = tempfile.mkdtemp()
    >>> backbone.save_to_preset(folder)
    >>> model = keras_moe.from_preset(folder, keras_hub.models.Backbone)
    >>> type(model).__name__
    'SparseMixtralBackbone'
    """
    check_options(
        dispatch,
        aux_loss_factor,
        bias_update_rate,
        train_capacity_factor,
        eval_capacity_factor,
        dropless_buffer_factor,
    )
    cls = cls or keras_hub.models.CausalLM
    loader = preset_utils.get_preset_loader(preset)
    if isinstance(loader, TransformersPresetLoader):
        loader = _TransformersLoader(preset, loader.config)
    backbone_cls = loader.check_backbone_class()
    if issubclass(cls, keras_hub.models.Backbone):
        if not issubclass(backbone_cls, cls):
            raise ValueError(
                f"`cls` {cls.__name__} does not match the preset's backbone "
                f"{backbone_cls.__name__}."
            )
        model = loader.load_backbone(backbone_cls, load_weights, **kwargs)
    elif issubclass(cls, keras_hub.models.CausalLM):
        if cls.backbone_cls != backbone_cls:
            cls = preset_utils.find_subclass(preset, cls, backbone_cls)
        model = loader.load_task(cls, load_weights, True, **kwargs)
    else:
        raise ValueError(
            "`cls` must be a keras-hub Backbone or CausalLM class, got "
            f"{getattr(cls, '__name__', cls)!r}."
        )
    if is_sparse(model) or not sparse:  # a preset saved sparse, or the dense model asked for
        return model
    return sparsify(
        model,
        dispatch=dispatch,
        aux_loss_factor=aux_loss_factor,
        bias_update_rate=bias_update_rate,
        train_capacity_factor=train_capacity_factor,
        eval_capacity_factor=eval_capacity_factor,
        track_metrics=track_metrics,
        dropless_buffer_factor=dropless_buffer_factor,
    )
