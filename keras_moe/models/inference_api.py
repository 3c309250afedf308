"""`EncoderDecoder`'s inference entry points: `generate` (token ids or text in and
out), `export_for_serving` (a SavedModel of the compiled search) and `export` (Keras'
export of the forward pass, refused with the ways out for a model never called).
"""

from keras_moe.models import decoding, serving, text_io


class InferenceApiMixin:
    """The decoding and export methods of `EncoderDecoder` (a `keras.Model` with a
    `T5Config` as `config`)."""

    def generate(
        self,
        encoder_input_tokens,
        max_length=64,
        method=None,
        num_beams=None,
        length_penalty=0.0,
        use_cache=True,
        eos_id=None,
        return_scores=False,
        compiled=True,
        jit_compile=False,
        length_normalizer="gnmt",
        beam_size=None,
        vocabulary=None,
    ):
        """Decodes token ids `[B, <= max_length]`, or text to text (see
        `keras_moe.models.decoding.generate`; `length_normalizer="hf"` ranks beams as HF
        transformers does).

        Args:
            encoder_input_tokens: int token ids `[B, L]`, or a string or list of
                strings (then `vocabulary` tokenizes them and the outputs are text).
            method: "greedy" or "beam"; default "beam" when `num_beams` or
                `beam_size` > 1 is given, else "greedy".
            num_beams: beams of beam search (default 4).
            beam_size: the CLI's name (`keras-moe-eval --beam_size`): 1 is
                greedy, N > 1 beam search with N beams.
            vocabulary: for text inputs: a seqio vocabulary
                (`keras_moe.tasks.get_vocabulary()`) or a SentencePiece `.model` path.
            The others: see `keras_moe.models.decoding.generate`.
        """
        method, num_beams = decoding.beam_arguments(method, num_beams, beam_size)
        text = text_io.is_text(encoder_input_tokens)
        single = isinstance(encoder_input_tokens, (str, bytes))
        if text:
            if vocabulary is None:
                raise ValueError(
                    "`generate` got text: pass the vocabulary that tokenizes it, e.g. "
                    "`vocabulary=keras_moe.tasks.get_vocabulary()` (the local tasks' "
                    "SentencePiece model) or a checkpoint's `spiece.model` path."
                )
            vocabulary = text_io.load_vocabulary(vocabulary)
            eos = self.config.eos_id if eos_id is None else eos_id
            encoder_input_tokens = text_io.encode_texts(
                encoder_input_tokens, vocabulary, eos, self.config.pad_id
            )
        out = decoding.generate(
            self,
            encoder_input_tokens,
            max_length=max_length,
            method=method,
            num_beams=num_beams,
            length_penalty=length_penalty,
            use_cache=use_cache,
            eos_id=eos_id,
            return_scores=return_scores,
            compiled=compiled,
            jit_compile=jit_compile,
            length_normalizer=length_normalizer,
        )
        if not text:
            return out
        tokens, scores = out if return_scores else (out, None)
        texts = text_io.decode_tokens(tokens, vocabulary, eos)
        if single:
            texts, scores = texts[0], None if scores is None else scores[0]
        return (texts, scores) if return_scores else texts

    def export_for_serving(self, path, vocabulary=None, **kwargs):
        """Writes a TensorFlow SavedModel of the compiled search with token and text
        signatures (see `keras_moe.models.serving.export_for_serving`)."""
        return serving.export_for_serving(self, path, vocabulary=vocabulary, **kwargs)

    def export(self, filepath, format="tf_saved_model", input_signature=None, **kwargs):
        """Keras' `Model.export` of the forward pass (logits). A model that was never
        called has no input shapes to export with: then it names the ways out."""
        if input_signature is None and not getattr(self, "_called", False):
            raise ValueError(
                "EncoderDecoder.export writes the forward pass (token ids -> logits) and "
                "needs the input shapes: call the model once on a batch of the shapes to "
                "serve, or pass `input_signature` (a dict of int32 specs "
                "`encoder_input_tokens` and `decoder_input_tokens` [batch, length] with a "
                "fixed length: MoE layers size their capacity from it). To serve "
                "decoding (token ids or text in, generated tokens out), use "
                "`model.export_for_serving(path)`."
            )
        return super().export(filepath, format=format, input_signature=input_signature, **kwargs)
