"""Independent helpers for the task tests (no code from `tasks` used here)."""

import zlib

import numpy as np

EXTRA_IDS = 100
EOS_ID = 1


def chapter_split(book, chapter):
    """Re-implementation of the documented rule: CRC-32 % 100, 5% val, 5% test."""
    bucket = zlib.crc32(f"{book}:{chapter}".encode()) % 100
    return "validation" if bucket < 5 else "test" if bucket < 10 else "train"


def strip_eos(ids):
    ids = [int(i) for i in np.asarray(ids) if int(i) != 0]
    assert ids and ids[-1] == EOS_ID, f"no EOS at the end of {ids[-5:]}"
    return ids[:-1]


def merge_span_corruption(inputs, targets, vocab_size):
    """Puts the spans of `targets` back at their sentinels in `inputs`.

    Also checks the sentinel protocol: sentinels are vocab_size-1, -2, ... in
    order in the inputs, and the targets list the same sentinels in order,
    each followed by its span.
    """
    first_sentinel = vocab_size - EXTRA_IDS
    inputs, targets = strip_eos(inputs), strip_eos(targets)
    in_sentinels = [t for t in inputs if t >= first_sentinel]
    expected = [vocab_size - 1 - i for i in range(len(in_sentinels))]
    assert in_sentinels == expected, (in_sentinels, expected)
    spans, current = {}, None
    for t in targets:
        if t >= first_sentinel:
            current = t
            spans[current] = []
        else:
            assert current is not None, "targets must start with a sentinel"
            spans[current].append(t)
    assert list(spans) == expected[: len(spans)]
    merged = []
    for t in inputs:
        if t >= first_sentinel:
            merged.extend(spans.get(t, []))
        else:
            merged.append(t)
    return merged, len(in_sentinels)


def is_sublist(small, big):
    n = len(small)
    return any(big[i : i + n] == small for i in range(len(big) - n + 1))
