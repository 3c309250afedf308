"""`build_model`: a model from a `T5Config` (gin-configurable)."""

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
