"""`build_model` and `gin_path`: the entry points the training CLI uses."""

import os

from keras_moe.models.config import T5Config
from keras_moe.models.transformer import EncoderDecoder


def build_model(config=None, compile=False, learning_rate=1e-3, **overrides):
    """Builds an `EncoderDecoder` from a `T5Config` (gin-configurable as `build_model`).

    Args:
        config: a `T5Config` or dict; None uses `T5Config()` (T5.1.1-base).
        compile: compile with `compile_defaults(learning_rate)`.
        learning_rate: learning rate of the default optimizer.
        **overrides: fields of `T5Config` to replace.

    Returns:
        an `EncoderDecoder`.

    Example:
    >>> model = build_model(T5Config(vocab_size=64, d_model=32, num_heads=4, d_ff=64,
    ...     num_encoder_layers=2, num_decoder_layers=2))
    >>> type(model).__name__, model.config.d_model
    ('EncoderDecoder', 32)
    >>> build_model(model.config, d_model=16).config.d_model  # a field replaced
    16
    """
    if config is None:
        config = T5Config()
    elif isinstance(config, dict):
        config = T5Config.from_dict(config)
    if overrides:
        config = config.replace(**overrides)
    model = EncoderDecoder(config)
    if compile:
        model.compile(**model.compile_defaults(learning_rate=learning_rate))
    return model


def gin_dirs():
    """Folders searched for gin files: `<package>/gin_files/` then `<repo>/gin/`."""
    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    return [os.path.join(package, "gin_files"), os.path.join(os.path.dirname(package), "gin")]


def gin_path(name):
    """Path of a gin file by name: "switch_base_8", "models/switch_base_8" or "....gin".

    Bare names are looked up under `models/` too.

    Example:
    >>> gin_path("switch_tiny")  # the package's gin_files/models/switch_tiny.gin
    '.../models/switch_tiny.gin'
    """
    candidates = [name if name.endswith(".gin") else name + ".gin"]
    if "/" not in candidates[0]:
        candidates.append("models/" + candidates[0])
    for folder in gin_dirs():
        for candidate in candidates:
            path = os.path.join(folder, candidate)
            if os.path.isfile(path):
                return path
    raise ValueError(
        f"gin file {name!r} not found; looked for {candidates} in {gin_dirs()}.")
