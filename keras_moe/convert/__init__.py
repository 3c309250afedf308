"""Checkpoint import/export: HuggingFace T5 (v1.1) and SwitchTransformers safetensors."""

from keras_moe.convert.hf import from_hf, is_hf_folder, load_hf_weights, to_hf
from keras_moe.convert.hf_config import config_from_hf, config_to_hf

__all__ = [
    "config_from_hf",
    "config_to_hf",
    "from_hf",
    "is_hf_folder",
    "load_hf_weights",
    "to_hf",
]
