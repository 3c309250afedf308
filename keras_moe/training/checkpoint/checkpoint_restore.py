"""Finding, verifying and loading checkpoints (`keras_moe.training.checkpoint`).

`restore()` checks a checkpoint's size and sha256 (`verify_checkpoint`) before
loading it; `restore_newest()` skips a corrupt, truncated or unreadable one
with a log line naming the bad file and falls back to the previous good one.
"""

import os
import warnings

from keras_moe.training.checkpoint import sharded_checkpoint
from keras_moe.training.checkpoint.atomic_files import file_sha256
from keras_moe.training.checkpoint.checkpoint_manager import CheckpointManager
from keras_moe.training.checkpoint.checkpoint_names import MISMATCH_HINT, metadata_path
from keras_moe.training.checkpoint.rng_state import restore_seed_states
from keras_moe.training.errors import CorruptCheckpointError, TrainingConfigError
from keras_moe.training.log import log as default_log


def resolve_checkpoint(path, argument="checkpoint"):
    """`.weights.h5` file of `path`: the file itself, or the newest checkpoint of a
    keras-moe-train model dir (`<dir>/checkpoints`) or of a checkpoint folder.

    Raises `TrainingConfigError` (a `ValueError`) naming `argument` when
    `path` holds none.

    Example:
    >>> import os, shutil, tempfile
    >>> import keras
    >>> model_dir = tempfile.mkdtemp()  # as keras-moe-train leaves it: <dir>/checkpoints
    >>> model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
    >>> manager = CheckpointManager(os.path.join(model_dir, "checkpoints"))
    >>> _ = manager.save(model, step=300)
    >>> resolve_checkpoint(model_dir)
    '.../checkpoints/ckpt-00000300.weights.h5'
    >>> resolve_checkpoint(manager.directory) == resolve_checkpoint(model_dir)  # or the folder
    True
    >>> shutil.rmtree(model_dir)
    """
    if os.path.isdir(path):
        for folder in (os.path.join(path, "checkpoints"), path):
            meta = CheckpointManager(folder).latest()
            if meta:
                return meta["path"]
        raise TrainingConfigError(
            f"`{argument}` {path!r} is a folder without a checkpoint (ckpt-*.json + "
            "ckpt-*.weights.h5, or checkpoints/ of a model dir)."
        )
    if not os.path.isfile(path):
        raise TrainingConfigError(f"`{argument}` {path!r} does not exist.")
    return path


def verify_checkpoint(meta):
    """Checks `meta["path"]` against the size and sha256 in its metadata.

    Raises `CorruptCheckpointError` naming the file (checkpoints written
    before checksums were recorded are only checked for existence).
    """
    path = meta["path"]
    json_path = metadata_path(path)
    try:
        size = (
            sharded_checkpoint.folder_size(path) if os.path.isdir(path) else os.path.getsize(path)
        )
    except OSError as e:
        raise CorruptCheckpointError(f"checkpoint {path} is unreadable: {e}") from None
    if "size" in meta and size != meta["size"]:
        raise CorruptCheckpointError(
            f"checkpoint {path} is truncated or corrupt: {size} bytes, its metadata "
            f"{json_path} says {meta['size']}."
        )
    if "sha256" in meta and file_sha256(path) != meta["sha256"]:
        raise CorruptCheckpointError(
            f"checkpoint {path} is corrupt: its sha256 does not match its metadata {json_path}."
        )


def restore_newest(model, candidates, log=None):
    """Restores the newest loadable checkpoint of `candidates` (metadata dicts).

    A checkpoint whose file passes its checksum but cannot be read as HDF5
    (e.g. written by an old version without checksums, then damaged) is
    skipped with a log line naming it. A checkpoint that reads but does not
    fit the model raises `TrainingConfigError` (a config mistake, not damage).
    Returns the restored metadata, or None when no candidate could be loaded.
    """
    log = log or default_log
    for meta in sorted(candidates, key=lambda m: m["step"], reverse=True):
        try:
            restore(model, meta)
        except CorruptCheckpointError as e:
            log(f"{e} Skipping it; trying the previous checkpoint.")
            continue
        return meta
    return None


def _is_unreadable(error):
    text = str(error).lower()
    return isinstance(error, OSError) or any(
        k in text
        for k in (
            "unable to open",
            "truncated",
            "file signature",
            "bad object header",
            "unable to synchronously open",
            "not a valid hdf5",
            "can't open",
            "unable to read",
        )
    )


def skipped_variables(load):
    """Calls `load()` and returns the messages of the variables Keras skipped while
    loading weights: it only warns when a checkpoint lacks some (e.g. another optimizer)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        load()
    return [str(w.message) for w in caught if "Skipping variable loading" in str(w.message)]


def restore(model, meta, seed_states=True):
    """Loads a checkpoint (model + optimizer variables, seed-generator states) into a
    built, compiled model.

    `seed_states=False` leaves the random streams alone (evaluation draws none,
    and may run with other dropout settings than the training did).

    Raises `TrainingConfigError` naming the checkpoint when it does not fit the model.
    """
    if model.optimizer is not None and not model.optimizer.built:
        model.optimizer.build(model.trainable_variables)
    verify_checkpoint(meta)
    try:
        if os.path.isdir(meta["path"]):
            skipped = skipped_variables(lambda: sharded_checkpoint.restore(model, meta["path"]))
        else:
            skipped = skipped_variables(lambda: model.load_weights(meta["path"]))
    except (ValueError, KeyError, OSError) as e:
        if _is_unreadable(e):
            raise CorruptCheckpointError(
                f"checkpoint {meta['path']} is unreadable (truncated or corrupt): {e}"
            ) from None
        raise TrainingConfigError(
            f"checkpoint {meta['path']} does not match this model/optimizer ({e}). {MISMATCH_HINT}"
        ) from None
    # Keras only warns when it skips variables (e.g. another optimizer): refuse that.
    if skipped:
        raise TrainingConfigError(
            f"checkpoint {meta['path']} does not match this model/optimizer: "
            f"{skipped[0].strip()} {MISMATCH_HINT}"
        )
    if seed_states:
        restore_seed_states(model, meta)
