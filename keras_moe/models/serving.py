"""Export an `EncoderDecoder` with its compiled search as a TensorFlow SavedModel.

The SavedModel needs neither keras_moe nor Keras to run: load it with
`tf.saved_model.load` (plus `import tensorflow_text` for the text signature,
whose SentencePiece ops live there) or serve it with TF Serving. Signatures:

- `generate_ids` (also `serving_default`): `encoder_input_tokens` int32
  `[batch, length]` (0-padded to `max_input_length`; an input with more
  tokens is cut to `max_input_length - 1` of them and keeps its closing EOS,
  as seqio's `append_eos_after_trim` cuts training inputs) ->
  `output_tokens` int32 `[batch, max_length]` (EOS included, 0 after it) and
  `scores` float32 `[batch]` (log-probability of each output).
- `generate_text` (with a SentencePiece vocabulary): `inputs` string `[batch]`
  -> `outputs` string `[batch]`. The text is tokenized in the graph, cut to
  `max_input_length - 1` tokens and closed with EOS, as seqio's
  `append_eos_after_trim` does.

Each request is routed apart from the others in its batch (the search passes
`independent_routing=True` to the model), so co-batched requests do not change
each other's outputs.

TF Serving's model server has the SentencePiece ops; `saved_model_cli`
does not, so it runs SavedModels exported without a vocabulary.
"""

import keras
from keras import ops

from keras_moe.models.decoding import METHODS, pad_input_tokens, strip_ids
from keras_moe.models.search import (
    check_length_normalizer,
    check_search_arguments,
    stateless_search,
)
from keras_moe.validation import check_int


def _sentencepiece_model(vocabulary):
    """The serialized SentencePiece model of a seqio vocabulary or a `.model` path."""
    if isinstance(vocabulary, str):
        with open(vocabulary, "rb") as f:
            return f.read()
    model = getattr(vocabulary, "sp_model", None)
    if model is None:
        raise ValueError(
            "`vocabulary` must be a seqio.SentencePieceVocabulary or the path of a "
            f"SentencePiece `.model` file, got {type(vocabulary).__name__}."
        )
    return model


def export_for_serving(
    model,
    path,
    vocabulary=None,
    max_input_length=64,
    max_length=64,
    method="greedy",
    num_beams=4,
    length_penalty=0.0,
    eos_id=None,
    length_normalizer="gnmt",
):
    """Writes `model`'s search as a SavedModel with token and text signatures.

    Args:
        model: an `EncoderDecoder` (TensorFlow backend).
        path: directory of the SavedModel.
        vocabulary: None (ids only), a `seqio.SentencePieceVocabulary` or the
            path of a SentencePiece `.model`: adds the `generate_text` signature.
        max_input_length: encoder length the inputs are cut or padded to
            (MoE layers size their capacity from it), >= 1.
        max_length: most output tokens, >= 1.
        method: "greedy" or "beam".
        num_beams: beams of beam search, >= 1.
        length_penalty: length-penalty alpha of beam search.
        eos_id: end-of-sequence id; defaults to `model.config.eos_id`.
        length_normalizer: "gnmt" (default, T5X's `((5 + len) / 6) ** alpha`)
            or "hf" (HF transformers' `len ** alpha`); see
            `keras_moe.models.decoding.generate`.

    Returns:
        `path`.

    Example:
    >>> import os, tempfile
    >>> import numpy as np, tensorflow as tf
    >>> from keras_moe.models import EncoderDecoder, T5Config
    >>> model = EncoderDecoder(T5Config(vocab_size=32, d_model=16, num_heads=2, d_kv=8,
    ...     d_ff=32, num_encoder_layers=1, num_decoder_layers=1))
    >>> path = export_for_serving(model, os.path.join(tempfile.mkdtemp(), "served"),
    ...                           max_input_length=8, max_length=6)
    >>> served = tf.saved_model.load(path)
    >>> out = served.signatures["generate_ids"](
    ...     encoder_input_tokens=tf.constant([[5, 6, 1]], tf.int32))
    >>> out["output_tokens"].shape.as_list()
    [1, 6]
    """
    if keras.backend.backend() != "tensorflow":
        raise ValueError(
            "export_for_serving writes a TensorFlow SavedModel and needs "
            f"KERAS_BACKEND=tensorflow, got {keras.backend.backend()!r}; save the "
            "weights and export from a TensorFlow process."
        )
    check_int("max_input_length", max_input_length)
    if method not in METHODS:
        raise ValueError(f"`method` must be one of {METHODS}, got {method!r}.")
    beams = 1 if method == "greedy" else num_beams
    check_search_arguments(model, max_length, beams)
    check_length_normalizer(length_normalizer)
    import tensorflow as tf

    config = model.config
    eos_id = config.eos_id if eos_id is None else eos_id

    def generate_ids(encoder_input_tokens):
        inputs = _fit_to_length(encoder_input_tokens, max_input_length, config.pad_id, eos_id)
        tokens, scores, _ = stateless_search(
            model, inputs, max_length, beams, length_penalty, eos_id, length_normalizer
        )
        return {"output_tokens": tokens, "scores": scores}

    archive = keras.export.ExportArchive()
    archive.track(model)
    archive.add_endpoint(
        "generate_ids",
        generate_ids,
        input_signature=[tf.TensorSpec([None, None], tf.int32, name="encoder_input_tokens")],
    )
    if vocabulary is not None:
        _add_text_endpoint(
            archive, vocabulary, generate_ids, max_input_length, config.pad_id, eos_id
        )
    archive.write_out(path, verbose=False)
    return path


def _fit_to_length(tokens, length, pad_id, eos_id):
    """`tokens` padded to `length`; longer inputs cut, keeping a closing EOS."""
    import tensorflow as tf

    tokens = tf.pad(tokens, [[0, 0], [0, tf.maximum(length - tf.shape(tokens)[1], 0)]])
    positions = tf.range(tf.shape(tokens)[1])[None, :]
    last = tf.reduce_max(tf.where(tf.not_equal(tokens, pad_id), positions, -1), 1)
    ends_with_eos = tf.equal(tf.gather(tokens, tf.maximum(last, 0), batch_dims=1), eos_id)
    cut_eos = tf.logical_and(last >= length, ends_with_eos)
    tokens = tf.reshape(tokens[:, :length], [-1, length])
    closing = tf.where(cut_eos, eos_id, tokens[:, -1])
    return tf.concat([tokens[:, :-1], closing[:, None]], axis=1)


def _add_text_endpoint(archive, vocabulary, generate_ids, max_input_length, pad_id, eos_id):
    """The `generate_text` signature: SentencePiece in, `generate_ids`, text out."""
    import tensorflow as tf
    import tensorflow_text

    tokenizer = tensorflow_text.SentencepieceTokenizer(
        model=_sentencepiece_model(vocabulary), out_type=tf.int32
    )
    pieces = int(tokenizer.vocab_size())
    archive.track(tokenizer)

    def generate_text(inputs):
        ids = tokenizer.tokenize(inputs)[:, : max_input_length - 1]
        eos = tf.fill([ids.nrows(), 1], tf.constant(eos_id, tf.int32))
        ids = tf.concat([ids, eos], axis=1).to_tensor(default_value=pad_id)
        out = generate_ids(ids)["output_tokens"]
        before_eos = tf.equal(tf.cumsum(tf.cast(tf.equal(out, eos_id), tf.int32), axis=1), 0)
        keep = before_eos & tf.not_equal(out, pad_id) & tf.less(out, pieces)
        return {"outputs": tokenizer.detokenize(tf.ragged.boolean_mask(out, keep))}

    archive.add_endpoint(
        "generate_text",
        generate_text,
        input_signature=[tf.TensorSpec([None], tf.string, name="inputs")],
    )


def decode_with_vocabulary(model, texts, vocabulary, max_input_length=64, **generate_kwargs):
    """Reference for `generate_text`: seqio encode, `model.generate`, seqio decode.

    Args:
        model: an `EncoderDecoder`.
        texts: input strings.
        vocabulary: a `seqio.Vocabulary`.
        max_input_length: inputs are cut to `max_input_length - 1` tokens + EOS.
        **generate_kwargs: passed to `model.generate`.

    Returns:
        A list of output strings.

    Example:
    >>> from keras_moe.models import EncoderDecoder, T5Config
    >>> import seqio
    >>> model = EncoderDecoder(T5Config(vocab_size=359, d_model=16, num_heads=2, d_kv=8,
    ...     d_ff=32, num_encoder_layers=1, num_decoder_layers=1))
    >>> outputs = decode_with_vocabulary(model, ["Hello"], seqio.ByteVocabulary(),
    ...                                  max_length=4)
    >>> len(outputs), type(outputs[0]).__name__
    (1, 'str')
    """

    eos = model.config.eos_id
    ids = [list(vocabulary.encode(text))[: max_input_length - 1] + [eos] for text in texts]
    out = model.generate(pad_input_tokens(ids, max_input_length), **generate_kwargs)
    return [
        vocabulary.decode(strip_ids(ops.convert_to_numpy(row), eos, model.config.pad_id))
        for row in out
    ]
