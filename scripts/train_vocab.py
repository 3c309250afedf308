#!/usr/bin/env python3
"""Trains the committed SentencePiece model on the embedded corpus.

Reads ``tasks/data/embedded`` (English prose and the Bible slices of every
language there), trains a unigram model with T5's special ids (pad 0, eos 1,
unk 2, no bos) and byte fallback (so unseen scripts still encode), and writes
``tasks/data/vocab/embedded_8k.model``.  seqio appends 100 sentinel ids.

Example:
  python scripts/train_vocab.py --vocab_size 8000
"""

import argparse
import glob
import gzip
import json
import os
import tempfile

import sentencepiece as spm

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EMBEDDED = os.path.join(_REPO, "tasks", "data", "embedded")
OUT_PREFIX = os.path.join(_REPO, "tasks", "data", "vocab", "embedded_8k")


def corpus_lines(embedded_dir=EMBEDDED):
    """Yields training lines: prose paragraphs, then verses of each language."""
    with gzip.open(os.path.join(embedded_dir, "english.jsonl.gz"), "rt", encoding="utf-8") as f:
        for line in f:
            for para in json.loads(line)["text"].split("\n\n"):
                para = " ".join(para.split())
                if para:
                    yield para
    for path in sorted(glob.glob(os.path.join(embedded_dir, "bible_*.tsv.gz"))):
        with gzip.open(path, "rt", encoding="utf-8") as f:
            for line in f:
                yield line.rstrip("\n").split("\t", 3)[3]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--vocab_size", type=int, default=8000)
    parser.add_argument("--out_prefix", default=OUT_PREFIX)
    parser.add_argument("--num_threads", type=int, default=2)
    args = parser.parse_args(argv)
    if args.vocab_size < 300:
        raise ValueError(
            f"--vocab_size must be >= 300 (byte fallback uses 256 ids), got {args.vocab_size}"
        )
    os.makedirs(os.path.dirname(args.out_prefix), exist_ok=True)
    with tempfile.NamedTemporaryFile("w", suffix=".txt", encoding="utf-8", delete=False) as tmp:
        for line in corpus_lines():
            tmp.write(line + "\n")
    try:
        spm.SentencePieceTrainer.train(
            input=tmp.name,
            model_prefix=args.out_prefix,
            vocab_size=args.vocab_size,
            model_type="unigram",
            character_coverage=0.9995,
            byte_fallback=True,
            pad_id=0,
            eos_id=1,
            unk_id=2,
            bos_id=-1,
            input_sentence_size=2_000_000,
            shuffle_input_sentence=False,
            num_threads=args.num_threads,
            minloglevel=2,
        )
    finally:
        os.unlink(tmp.name)
    vocab_file = args.out_prefix + ".vocab"
    if os.path.exists(vocab_file):
        os.unlink(vocab_file)  # Only the .model file is needed (and committed).
    print(f"wrote {args.out_prefix}.model")


if __name__ == "__main__":
    main()
