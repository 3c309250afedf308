"""Configuring jobs with gin: parsing run files with clear errors, the registrations
of the model's configurables, and the refusal of bindings no call reads.

- `parse_gin`: gin files and bindings -> the `T5Config` they bind (`parse`).
- `GinConfigError`: a gin problem in one line, naming the binding (`errors`).
- `resolve`: a run file's name or path -> its path.
- `unread`: bindings of the model's configurables that no call read.
- `model_configurables`: `T5Config`, `build_model` and the MoE layers, for gin.
"""

from keras_moe.gin_config.errors import GinConfigError
from keras_moe.gin_config.parse import parse_gin, register_keyword_names, resolve

__all__ = ["GinConfigError", "parse_gin", "register_keyword_names", "resolve"]
