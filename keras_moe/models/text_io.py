"""Text in and out of `EncoderDecoder.generate`: SentencePiece encode, pad, decode at EOS.

The same steps as the exported SavedModel's `generate_text` signature
(`keras_moe.models.serving`), in NumPy for a notebook.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np


def is_text(value: Any) -> bool:
    """Whether `value` is a string or a (nested) list of them, or a NumPy array of text."""
    if isinstance(value, np.ndarray):
        return value.dtype.kind in "USO"
    return isinstance(value, (str, bytes)) or (
        isinstance(value, (list, tuple)) and len(value) > 0 and any(is_text(v) for v in value)
    )


def load_vocabulary(vocabulary: Any) -> Any:
    """A seqio vocabulary as given, or the `SentencePieceVocabulary` of a `.model` path.

    Args:
        vocabulary: a `seqio.Vocabulary` (`keras_moe.tasks.get_vocabulary()`, a
            Hugging Face checkpoint's `spiece.model` loaded with seqio) or the
            path of a SentencePiece `.model` file.
    """
    if isinstance(vocabulary, str):
        import seqio

        return seqio.SentencePieceVocabulary(vocabulary)
    if not (hasattr(vocabulary, "encode") and hasattr(vocabulary, "decode")):
        raise ValueError(
            "`vocabulary` must be a seqio vocabulary (e.g. keras_moe.tasks.get_vocabulary()) "
            f"or the path of a SentencePiece .model file, got {type(vocabulary).__name__}."
        )
    return vocabulary


def encode_texts(
    texts: Sequence[str], vocabulary: Any, eos_id: int = 1, pad_id: int = 0
) -> np.ndarray:
    """Token ids `[len(texts), longest + 1]`: each text's pieces, then EOS, then padding.

    Example:
    >>> class Letters:  # a stand-in vocabulary: one id per letter
    ...     def encode(self, text): return [ord(c) - 95 for c in text]
    >>> encode_texts(["ab", "c"], Letters()).tolist()
    [[2, 3, 1], [4, 1, 0]]
    """
    if isinstance(texts, (str, bytes)):
        texts = [texts]
    ids = []
    for i, text in enumerate(texts):
        if isinstance(text, bytes):
            text = text.decode("utf-8")
        if not isinstance(text, str):
            raise ValueError(
                f"`inputs` as text must be a list of strings; item {i} is {type(text).__name__}."
            )
        ids.append(list(vocabulary.encode(text)) + [eos_id])
    out = np.full((len(ids), max(len(x) for x in ids)), pad_id, np.int32)
    for row, pieces in zip(out, ids, strict=True):
        row[: len(pieces)] = pieces
    return out


def decode_tokens(tokens: np.ndarray, vocabulary: Any, eos_id: int = 1) -> list[str]:
    """Each row of generated ids as text, cut at its first EOS.

    Example:
    >>> class Letters:
    ...     def decode(self, ids): return "".join(chr(i + 95) for i in ids)
    >>> decode_tokens(np.array([[2, 3, 1, 0], [4, 1, 0, 0]]), Letters())
    ['ab', 'c']
    """
    texts = []
    for row in np.asarray(tokens).tolist():
        if eos_id in row:
            row = row[: row.index(eos_id)]
        texts.append(vocabulary.decode([int(i) for i in row]))
    return texts
