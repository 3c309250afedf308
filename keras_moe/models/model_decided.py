"""The arguments of a model's MoE layers that the model sets itself (name, dtype,
`causal`, ...): a sparse-FFN spec, a template layer or a gin binding giving one is
refused with a message saying who decides.
"""

import keras

# Set by the model for each layer, never taken from the spec; given for a model's
# sparse FFN they are refused, saying who decides.
MODEL_DECIDED = {
    "name": "the model names each layer after its place (encoder_layer_1/ffn)",
    "dtype": "the layers follow the model's dtype policy (train.dtype_policy; the router "
    "keeps float32 by its own router_dtype)",
    "trainable": "freeze layers of the built model instead (layer.trainable = False)",
    "causal": "the decoder's MoE layers are causal and the encoder's are not",
    "track_metrics": "bind T5Config.track_router_metrics instead",
    "metrics_prefix": "each layer's metrics are named after its place "
    "(encoder_layer_1/ffn/dropped_fraction)",
    "return_metrics": "the model reads the statistics through its metrics",
}


def model_decided_error(name: str, where: str) -> str:
    """The message refusing the model-decided argument `name` given by `where`."""
    return (
        f"{where}: `{name}` of a model's MoE layers is set by the model, not by its "
        f"sparse FFN: {MODEL_DECIDED[name]}. Remove it."
    )


def _refuse_given(kwargs, where):
    for name in MODEL_DECIDED:
        if name in kwargs:
            raise TypeError(model_decided_error(name, where))


def _refuse_set_on(layer):
    """A template layer (or a factory's) with a model-decided argument away from its
    default: the model would drop it silently."""
    given = [
        name
        for name, differs in (
            ("trainable", layer.trainable is not True),
            ("causal", layer.causal),
            ("metrics_prefix", layer.metrics_prefix is not None),
            ("return_metrics", layer.return_metrics),
            ("dtype", layer.dtype_policy.name != keras.config.dtype_policy().name),
        )
        if differs
    ]
    if given:
        raise TypeError(model_decided_error(given[0], f"`sparse_ffn` {type(layer).__name__}"))
