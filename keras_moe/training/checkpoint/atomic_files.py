"""Files written atomically: a reader, or a crash, sees the old file or the new one.

Each write goes to a temporary name in the same folder, is flushed with fsync
and renamed into place; the folder is fsynced after the rename.
"""

import hashlib
import os


def _fsync_dir(path):
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:  # pragma: no cover - platforms without directory fds
        return
    try:
        os.fsync(fd)
    except OSError:  # pragma: no cover
        pass
    finally:
        os.close(fd)


def fsync_file(path):
    """Flushes the file at `path` to disk."""
    with open(path, "rb+") as f:
        f.flush()
        os.fsync(f.fileno())


def file_sha256(path):
    """The sha256 hex digest of the file at `path`, read in 1 MiB chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def atomic_write_text(path, text):
    """Writes `text` to `path` via a fsynced temporary file and a rename."""
    atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_bytes(path, data):
    """Writes `data` to `path` via a fsynced temporary file and a rename: a reader
    (or a crash) sees the old file or the new one, never a part of it."""
    folder = os.path.dirname(os.path.abspath(path))
    tmp = os.path.join(folder, f".tmp-{os.getpid()}-{os.path.basename(path)}")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    _fsync_dir(folder)
