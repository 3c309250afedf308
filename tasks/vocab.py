"""Vocabularies shared by all task families.

Two offline choices:
  * "sentencepiece" (default): a SentencePiece unigram model trained on the
    embedded corpus (``scripts/train_vocab.py``), committed under
    ``tasks/data/vocab``, with 100 sentinel ids appended as in T5.
  * "byte": ``seqio.ByteVocabulary(extra_ids=100)`` (UTF-8 bytes, no file).

Every registered task exists once per vocabulary kind; the byte variant has
the suffix ``_byte`` (``embedded_span_corruption_byte``).
"""

import functools
import os

import seqio

EXTRA_IDS = 100
VOCAB_KINDS = ("sentencepiece", "byte")
DEFAULT_VOCAB = "sentencepiece"
SENTENCEPIECE_MODEL = os.path.join(
    os.path.dirname(os.path.abspath(__file__)), "data", "vocab", "embedded_8k.model"
)
_SUFFIX = {"sentencepiece": "", "byte": "_byte"}


def _check_kind(kind):
    if kind not in VOCAB_KINDS:
        raise ValueError(f"kind must be one of {list(VOCAB_KINDS)}, got {kind!r}")
    return kind


@functools.lru_cache(maxsize=None)
def get_vocabulary(kind=DEFAULT_VOCAB):
    """Returns the shared seqio vocabulary of the given kind.

    Args:
      kind: "sentencepiece" (the committed local model) or "byte".

    Returns:
      A `seqio.Vocabulary` with 100 extra (sentinel) ids; `.vocab_size`
      includes them.

    Example:
      >>> vocab = get_vocabulary("byte")
      >>> vocab.vocab_size
      359
    """
    _check_kind(kind)
    if kind == "byte":
        return seqio.ByteVocabulary(extra_ids=EXTRA_IDS)
    # Loaded lazily by seqio; a missing file only matters when encoding, and
    # `check_sentencepiece_model()` says how to rebuild it.
    return seqio.SentencePieceVocabulary(SENTENCEPIECE_MODEL, extra_ids=EXTRA_IDS)


def check_sentencepiece_model():
    """Raises FileNotFoundError naming the rebuild command if the model is gone."""
    if not os.path.exists(SENTENCEPIECE_MODEL):
        raise FileNotFoundError(
            f"SentencePiece model {SENTENCEPIECE_MODEL} is missing; rebuild it "
            "with `python scripts/train_vocab.py` or use the byte vocabulary."
        )
    return SENTENCEPIECE_MODEL


def vocabulary_size(kind=DEFAULT_VOCAB):
    """Number of ids of the vocabulary, sentinels included (the model's vocab).

    Example:
      >>> vocabulary_size("byte")
      359
    """
    return get_vocabulary(kind).vocab_size


def output_features(kind=DEFAULT_VOCAB):
    """T5-style output features: "inputs" and "targets", both with EOS.

    Example:
      >>> sorted(output_features("byte"))
      ['inputs', 'targets']
    """
    vocab = get_vocabulary(kind)
    return {
        "inputs": seqio.Feature(vocabulary=vocab, add_eos=True),
        "targets": seqio.Feature(vocabulary=vocab, add_eos=True),
    }


def task_name(base_name, kind=DEFAULT_VOCAB):
    """Registered name of a task for a vocabulary kind.

    Example:
      >>> task_name("wmt14_ende", "byte")
      'wmt14_ende_byte'
    """
    return base_name + _SUFFIX[_check_kind(kind)]
