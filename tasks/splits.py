"""Deterministic, content-independent assignment of units to splits.

A unit (a Bible chapter, a documentation file, a block of a play) is hashed
with CRC-32 of a stable key; the hash decides the split.  The same key always
lands in the same split on every machine and Python version.
"""

import zlib

SPLITS = ("train", "validation", "test")


def split_of(key, validation_percent=5, test_percent=5):
    """Returns "train", "validation" or "test" for a unit key.

    Args:
      key: a string naming the unit, e.g. "43:3" for John chapter 3.
      validation_percent: share of units (0-100) sent to "validation".
      test_percent: share of units (0-100) sent to "test".

    Example:
      >>> split_of("43:3") in ("train", "validation", "test")
      True
    """
    if not 0 <= validation_percent + test_percent <= 100:
        raise ValueError(
            "validation_percent + test_percent must be in [0, 100], got "
            f"{validation_percent} + {test_percent}"
        )
    bucket = zlib.crc32(key.encode("utf-8")) % 100
    if bucket < validation_percent:
        return "validation"
    if bucket < validation_percent + test_percent:
        return "test"
    return "train"


def check_split(split, allowed=SPLITS):
    """Raises a ValueError naming `split` when it is not one of `allowed`."""
    if split not in allowed:
        raise ValueError(f"split must be one of {list(allowed)}, got {split!r}")
    return split
