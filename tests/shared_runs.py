"""Directories built once per pytest run and shared by all its xdist workers.

A session fixture runs once per worker process; the folder above a worker's
base temporary directory is the same for every worker of one run, so a file
lock there lets the first worker build a directory and the others reuse it.
Tests that change what they get must copy it first (`shutil.copytree`).
"""

import contextlib
import fcntl
import os
import shutil


def _run_root(tmp_path_factory):
    """A folder of this pytest run that every xdist worker of the run sees."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


@contextlib.contextmanager
def _locked(path):
    with open(path, "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)  # released when the file is closed
        yield


def built_once(tmp_path_factory, name, build):
    """The path of `<run folder>/shared/<name>`, filled by `build(path)` the first
    time any worker of this run asks for it.

    `build` writes into a scratch folder that is renamed into place only when it
    returns, so a build that fails leaves nothing behind and the next test that
    asks builds (and fails) again, with its own error.
    """
    root = _run_root(tmp_path_factory) / "shared"
    root.mkdir(exist_ok=True)
    final = root / name
    with _locked(root / f"{name}.lock"):
        if not final.exists():
            scratch = root / f"{name}.building"
            shutil.rmtree(scratch, ignore_errors=True)
            scratch.mkdir()
            build(scratch)
            scratch.rename(final)
    return final
