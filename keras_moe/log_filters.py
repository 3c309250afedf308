"""Log records that are expected here and say nothing a user can act on, and their filters."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator

# (logger name, message start): absl/Python log records that are expected here.
HARMLESS_LOG_MESSAGES = (
    # seqio, for tasks read from in-memory or local files: the training stream
    # is shuffled by seqio with a seed and resumed by position, not by a cache.
    ("absl", "Using an uncached FunctionDataset for training is not recommended"),
)


class _DropMessages(logging.Filter):
    def __init__(self, starts):
        super().__init__()
        self.starts = tuple(starts)

    def filter(self, record):
        return not str(record.msg).startswith(self.starts)


def _filters() -> dict[str, logging.Filter]:
    return {
        name: _DropMessages(m for n, m in HARMLESS_LOG_MESSAGES if n == name)
        for name in {name for name, _ in HARMLESS_LOG_MESSAGES}
    }


def drop_harmless_log_messages() -> None:
    """Drops `HARMLESS_LOG_MESSAGES` from here on (the command-line tools). Idempotent."""
    for name, drop in _filters().items():
        log = logging.getLogger(name)
        if not any(isinstance(f, _DropMessages) for f in log.filters):
            log.addFilter(drop)


@contextlib.contextmanager
def harmless_log_messages_dropped() -> Iterator[None]:
    """Drops `HARMLESS_LOG_MESSAGES` inside the block (a notebook's `tasks.get_dataset`),
    leaving the loggers as they were afterwards.

    Example:
    >>> import logging
    >>> with harmless_log_messages_dropped():
    ...     logging.getLogger("absl").warning("Using an uncached FunctionDataset for "
    ...                                       "training is not recommended")  # not shown
    """
    filters = _filters()
    for name, drop in filters.items():
        logging.getLogger(name).addFilter(drop)
    try:
        yield
    finally:
        for name, drop in filters.items():
            logging.getLogger(name).removeFilter(drop)
