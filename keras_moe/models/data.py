"""seqio `EncDecFeatureConverter` features -> Keras `(x, y, sample_weight)`."""

MODEL_FEATURES = ("encoder_input_tokens", "decoder_input_tokens", "encoder_segment_ids",
                  "encoder_positions", "decoder_segment_ids", "decoder_positions")


def seqio_to_keras(features):
    """Splits a seqio encoder-decoder feature dict for `model.fit`.

    Usable as `dataset.map(seqio_to_keras)`. The model inputs keep the packing
    features when present; the targets are `decoder_target_tokens` and the
    sample weights `decoder_loss_weights` (or `targets > 0` without them).

    Args:
        features: dict from `seqio.EncDecFeatureConverter`.

    Returns:
        `(inputs_dict, decoder_target_tokens, decoder_loss_weights)`.

    Example:
    >>> ds = converted_ds.map(seqio_to_keras)
    >>> model.fit(ds.batch(8))
    """
    inputs = {k: features[k] for k in MODEL_FEATURES if k in features}
    targets = features["decoder_target_tokens"]
    weights = features.get("decoder_loss_weights")
    if weights is None:
        import tensorflow as tf

        weights = tf.cast(tf.not_equal(targets, 0), tf.float32)
    else:
        weights = _to_float(weights)
    return inputs, targets, weights


def _to_float(x):
    try:
        import tensorflow as tf

        if isinstance(x, tf.Tensor):
            return tf.cast(x, tf.float32)
    except ImportError:  # pragma: no cover
        pass
    import numpy as np

    return np.asarray(x, np.float32)
