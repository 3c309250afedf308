"""A model's variables by their path relative to the model, to match two models' weights."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import keras


def relative_paths(model: keras.Model) -> dict[str, keras.Variable]:
    """`{path relative to model: variable}`, the common folder prefix of all paths removed.

    Two `EncoderDecoder`s built anywhere (top level, or inside another
    model's scope) give the same relative paths for the same architecture.

    Args:
        model: a built Keras model.

    Example:
    >>> from keras_moe.models import EncoderDecoder, T5Config
    >>> config = T5Config(vocab_size=32, d_model=16, num_heads=2, d_kv=8, d_ff=32,
    ...     num_encoder_layers=1, num_decoder_layers=1)
    >>> model, other = EncoderDecoder(config), EncoderDecoder(config)
    >>> sorted(relative_paths(model))[:1]
    ['decoder_layer_0/cross_attention/key']
    >>> relative_paths(model).keys() == relative_paths(other).keys()
    True
    """
    variables = list(model.weights)
    paths = [v.path for v in variables]
    if len(set(paths)) != len(paths):
        raise ValueError(
            f"model {model.name!r} has duplicate variable paths; cannot match variables by path."
        )
    prefix = ""
    if paths:
        parts = [p.split("/") for p in paths]
        common = []
        for items in zip(*[p[:-1] for p in parts], strict=False):
            if len(set(items)) != 1:
                break
            common.append(items[0])
        prefix = "/".join(common) + "/" if common else ""
    return {p[len(prefix) :]: v for p, v in zip(paths, variables, strict=False)}
