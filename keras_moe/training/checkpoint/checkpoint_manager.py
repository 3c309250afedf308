"""`CheckpointManager`: writes, lists and prunes the `ckpt-<step>` checkpoints of a folder.

The format and its guarantees are described in `keras_moe.training.checkpoint`.
"""

import glob
import json
import os
import shutil
import time

from keras_moe.training.checkpoint import sharded_checkpoint
from keras_moe.training.checkpoint.atomic_files import atomic_write_text, file_sha256, fsync_file
from keras_moe.training.checkpoint.checkpoint_names import (
    META_NAME,
    SEED_STATES_FIELD,
    WEIGHTS_SUFFIXES,
)
from keras_moe.training.checkpoint.rng_state import read_seed_states
from keras_moe.training.errors import TrainingConfigError
from keras_moe.validation import is_int


def _sync_jax_state(model):
    """Writes JAX's training state back into `model`'s variables, stale in the middle of
    `fit` (`Callback.model` does it too; this covers a model passed in directly)."""
    sync = getattr(model, "jax_state_sync", None)  # JAX models only
    if sync is not None:
        sync()


class CheckpointManager:
    """Saves, lists, prunes and restores `ckpt-<step>` checkpoints in `directory`.

    Args:
        directory: checkpoint folder (created on first save).
        keep: how many newest checkpoints to keep (>= 1).
        sharded: write Orbax folders (a model sharded over several JAX
            processes; every process calls `save`).
        primary: whether this process writes the metadata and prunes
            (process 0).

    Example:
    >>> import os, shutil, tempfile
    >>> import keras
    >>> model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
    >>> run = tempfile.mkdtemp()
    >>> manager = CheckpointManager(os.path.join(run, "checkpoints"), keep=2)
    >>> for step in (100, 200, 300):
    ...     meta = manager.save(model, step=step, batches_consumed=step)
    >>> manager.latest()["step"]
    300
    >>> [m["step"] for m in manager.all()]  # older ones pruned: keep=2
    [200, 300]
    >>> from keras_moe.training.checkpoint import verify_checkpoint
    >>> verify_checkpoint(manager.latest())  # size and sha256 as recorded
    >>> model.load_weights(manager.latest()["path"])
    >>> shutil.rmtree(run)
    """

    def __init__(self, directory, keep=3, sharded=False, primary=True):
        if not is_int(keep) or keep < 1:
            raise TrainingConfigError(f"`keep_checkpoints` must be an integer >= 1, got {keep!r}.")
        self.directory = directory
        self.keep = keep
        self.sharded = sharded
        self.primary = primary

    def weights_path(self, step):
        suffix = ".orbax" if self.sharded else ".weights.h5"
        return os.path.join(self.directory, f"ckpt-{step:08d}{suffix}")

    def meta_path(self, step):
        return os.path.join(self.directory, f"ckpt-{step:08d}.json")

    def save(self, model, step, batches_consumed=None, extra=None):
        """Writes checkpoint `step` atomically and prunes old ones; returns its metadata
        (with the seed-generator states of `read_seed_states`)."""
        os.makedirs(self.directory, exist_ok=True)
        _sync_jax_state(model)
        step = int(step)
        final = self.weights_path(step)
        if self.sharded:
            sharded_checkpoint.save(model, final)
            fields = {"size": sharded_checkpoint.folder_size(final), "format": "orbax"}
        else:
            tmp = self._write_weights(model, step)
            fields = {"size": os.path.getsize(tmp), "sha256": file_sha256(tmp)}
            os.replace(tmp, final)
        meta = {
            "step": step,
            "batches_consumed": int(step if batches_consumed is None else batches_consumed),
            "weights": os.path.basename(final),
            "time": time.time(),
            SEED_STATES_FIELD: read_seed_states(model),
            **fields,
            **(extra or {}),
        }
        if self.primary:
            self._commit(meta)
        return meta

    def _write_weights(self, model, step):
        """`model.save_weights` to a fsynced temporary file in the folder; returns its path."""
        tmp = os.path.join(self.directory, f".tmp-{os.getpid()}-ckpt-{step:08d}.weights.h5")
        try:
            model.save_weights(tmp, overwrite=True)
            fsync_file(tmp)
        except BaseException:
            try:  # A failed write leaves neither a temp file nor a new checkpoint.
                os.remove(tmp)
            except OSError:
                pass
            raise
        return tmp

    def _commit(self, meta):
        step = meta["step"]
        atomic_write_text(self.meta_path(step), json.dumps(meta, indent=1, sort_keys=True))
        atomic_write_text(
            os.path.join(self.directory, "checkpoint"),
            json.dumps({"latest": os.path.basename(self.meta_path(step))}),
        )
        self._prune()

    def all(self):
        """Committed checkpoints' metadata, oldest first (json present, weights present)."""
        out = []
        for path in glob.glob(os.path.join(self.directory, "ckpt-*.json")):
            if not META_NAME.match(os.path.basename(path)):
                continue
            try:
                with open(path, encoding="utf-8") as f:
                    meta = json.load(f)
            except (OSError, ValueError):
                continue  # A torn json can only come from outside this class.
            if not isinstance(meta, dict) or not isinstance(meta.get("step"), int):
                continue
            weights = os.path.join(self.directory, str(meta.get("weights", "")))
            if not meta.get("weights") or not os.path.exists(weights):
                continue
            meta["path"] = weights
            out.append(meta)
        return sorted(out, key=lambda m: m["step"])

    def latest(self):
        """Metadata (with "path") of the newest committed checkpoint, or None."""
        found = self.all()
        return found[-1] if found else None

    def _prune(self):
        committed = self.all()
        for meta in committed[: -self.keep]:
            for path in (meta["path"], self.meta_path(meta["step"])):
                _remove(path)
        keep = {os.path.basename(m["path"]) for m in committed[-self.keep :]}
        # Orphans: weights whose json never got written (a crash between the two).
        for suffix in WEIGHTS_SUFFIXES:
            for path in glob.glob(os.path.join(self.directory, f"ckpt-*{suffix}")):
                if os.path.basename(path) not in keep:
                    stem = os.path.basename(path)[: -len(suffix)]
                    if not os.path.exists(os.path.join(self.directory, stem + ".json")):
                        _remove(path)
        # Orbax's own temporary folders of a save that never finished.
        tmp = glob.glob(os.path.join(self.directory, ".tmp-*")) + glob.glob(
            os.path.join(self.directory, "ckpt-*.orbax-checkpoint-tmp*")
        )
        for path in tmp:
            try:
                if time.time() - os.path.getmtime(path) > 60:
                    _remove(path)
            except OSError:
                pass


def _remove(path):
    """Removes a file or an Orbax folder; a missing one is fine."""
    try:
        if os.path.isdir(path):
            shutil.rmtree(path)
        else:
            os.remove(path)
    except FileNotFoundError:
        pass
