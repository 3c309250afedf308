"""seqio `EncDecFeatureConverter` features -> Keras `(x, y, sample_weight)`."""

import numpy as np

MODEL_FEATURES = (
    "encoder_input_tokens",
    "decoder_input_tokens",
    "encoder_segment_ids",
    "encoder_positions",
    "decoder_segment_ids",
    "decoder_positions",
)


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
    >>> import numpy as np
    >>> import tensorflow as tf
    >>> from keras_moe.models import EncoderDecoder, T5Config
    >>> converted_ds = tf.data.Dataset.from_tensor_slices({  # as EncDecFeatureConverter gives
    ...     "encoder_input_tokens": np.array([[5, 6, 1, 0]] * 4, "int32"),
    ...     "decoder_input_tokens": np.array([[0, 7, 8]] * 4, "int32"),
    ...     "decoder_target_tokens": np.array([[7, 8, 1]] * 4, "int32"),
    ...     "decoder_loss_weights": np.array([[1, 1, 1]] * 4, "int32")})
    >>> ds = converted_ds.map(seqio_to_keras)
    >>> inputs, targets, weights = next(iter(ds))
    >>> sorted(inputs), targets.numpy().tolist(), weights.dtype.name
    (['decoder_input_tokens', 'encoder_input_tokens'], [7, 8, 1], 'float32')
    >>> model = EncoderDecoder(T5Config(vocab_size=32, d_model=16, num_heads=2, d_kv=8,
    ...     d_ff=32, num_encoder_layers=1, num_decoder_layers=1))
    >>> model.compile(**model.compile_defaults(), run_eagerly=True)  # eager: no tracing
    >>> history = model.fit(ds.batch(2), verbose=0)
    >>> sorted(history.history)
    ['accuracy', 'loss', 'neg_log_perplexity']
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

    return np.asarray(x, np.float32)
