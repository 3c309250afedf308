"""Atomic step checkpoints with retention, and the preemption backup.

A checkpoint `ckpt-<step>` is two entries in one folder:
  * `ckpt-<step>.weights.h5`: `model.save_weights` (model and optimizer
    variables, so the step counter `optimizer.iterations` comes back too);
    or, for a model sharded over several JAX processes, `ckpt-<step>.orbax/`:
    the same state written by Orbax, each process its own shards, read back
    into each variable's current sharding (whatever mesh the reading model has);
  * `ckpt-<step>.json`: metadata written last, which commits the checkpoint
    (step, batches of the training stream consumed, time), and the states of
    the model's `keras.random.SeedGenerator`s (dropout, router jitter and
    random policies: a seed and a counter each, which neither weights format
    holds), so a resumed run draws the random numbers an uninterrupted one
    would have drawn. They are keyed by the owning layers' classes (see
    `seed_states`); a checkpoint written before they were recorded restores
    without them.
Both are written to a temporary name in the same folder, flushed with fsync
and renamed (Orbax does the same for its folder), so a crash at any moment
leaves the previous checkpoint intact; weights without their json are
ignored and cleaned up. A `checkpoint` index file (also written atomically)
names the newest one. With several processes, all of them write the Orbax
state and process 0 alone writes the json, the index and the pruning.

The json records the weights file's size and sha256 (Orbax folders: the
size; Orbax checks its own files). `restore()` checks them
(`verify_checkpoint`) before loading; `restore_newest()` skips a corrupt,
truncated or unreadable checkpoint with a log line naming the bad file and
falls back to the previous good one.
"""

import glob
import hashlib
import json
import os
import re
import shutil
import time
import warnings

import keras
import numpy as np

from keras_moe import compat
from keras_moe.training import sharded_checkpoint
from keras_moe.training.errors import CorruptCheckpointError, TrainingConfigError
from keras_moe.training.log import log as default_log
from keras_moe.validation import is_int

_NAME = re.compile(r"^ckpt-(\d+)\.json$")
_WEIGHTS_SUFFIXES = (".weights.h5", ".orbax")
_SEED_STATES = "seed_states"  # the metadata field
_HINT = ("Use a fresh --model_dir, or the gin config the checkpoint was trained with "
         "(its operative_config.gin).")


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


def _fsync_file(path):
    with open(path, "rb+") as f:
        f.flush()
        os.fsync(f.fileno())


def file_sha256(path):
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


def _sync_jax_state(model):
    """Writes JAX's training state back into `model`'s variables, stale in the middle of
    `fit` (`Callback.model` does it too; this covers a model passed in directly)."""
    sync = getattr(model, "jax_state_sync", None)  # JAX models only
    if sync is not None:
        sync()


def seed_states(model):
    """The state variables of `model`'s `keras.random.SeedGenerator`s, by where they sit.

    A state's own `.path` (`seed_generator_17/seed_generator_state`) counts all the
    generators made in the process, so it differs between two builds of one model. The
    key names the owning layers by class instead, numbered among their siblings as in
    `.weights.h5` files, e.g. `encoder_block_1/switch_feed_forward/switch_router/seed_generator`.

    Args:
        model: a Keras model (or layer).

    Returns:
        dict key -> state variable, in `model.variables` order.

    Example:
    >>> import keras
    >>> model = keras.Sequential([keras.Input((4,)), keras.layers.Dropout(0.1),
    ...                           keras.layers.Dense(2), keras.layers.Dropout(0.2)])
    >>> list(seed_states(model))
    ['dropout/seed_generator', 'dropout_1/seed_generator']
    """
    found = {}
    # Keras lists a layer's generators and sublayers only in private attributes (absent
    # from objects that merely have `save_weights`: they have no generators).
    _collect_seed_states(model, "", set(), found)
    return found


def _collect_seed_states(layer, prefix, seen, found):
    """Adds `layer`'s seed states under `prefix`, then its sublayers' (as `Layer.variables`).

    Args:
        layer: a Keras layer.
        prefix: the key of `layer`, "" or ending with "/".
        seen: ids of the states already found (a shared layer counts once).
        found: dict key -> state variable, filled in.
    """
    for i, generator in enumerate(compat.seed_generators(layer)):
        if id(generator.state) not in seen:
            seen.add(id(generator.state))
            found[prefix + _numbered("seed_generator", i)] = generator.state
    siblings = {}
    for child in compat.direct_sublayers(layer):
        name = _snake_case(type(child).__name__)
        siblings[name] = siblings.get(name, -1) + 1
        _collect_seed_states(child, f"{prefix}{_numbered(name, siblings[name])}/", seen, found)


def _numbered(name, index):
    return f"{name}_{index}" if index else name


def _snake_case(name):
    name = re.sub("(.)([A-Z][a-z]+)", r"\1_\2", name)
    return re.sub("([a-z])([A-Z])", r"\1_\2", name).lower()


def read_seed_states(model):
    """`{key: [seed, counter]}` of `model`'s seed generators (`seed_states`), as ints.

    Args:
        model: a Keras model whose variables hold the current state.
    """
    return {key: [int(x) for x in _host_value(variable).reshape(-1)]
            for key, variable in seed_states(model).items()}


def _host_value(variable):
    """`variable`'s value as NumPy. A JAX array spread over several processes is read
    through the shard this process holds: seed states are replicated."""
    value = variable.value
    if not getattr(value, "is_fully_addressable", True):
        value = value.addressable_shards[0].data
    return np.asarray(keras.ops.convert_to_numpy(value))


def _assign_host(variable, array):
    """Assigns the NumPy `array` to `variable`; a JAX variable keeps its sharding, which
    may span several processes (each builds the shards it holds)."""
    value = variable.value
    if hasattr(value, "addressable_shards"):
        import jax

        host = array
        array = jax.make_array_from_callback(host.shape, value.sharding,
                                             lambda index: host[index])
    variable.assign(array)


def _restore_seed_states(model, meta):
    """Assigns the seed-generator states recorded in `meta` to `model`'s generators.

    Args:
        model: the model being restored.
        meta: the checkpoint's metadata; one without the field restores nothing.

    Raises:
        TrainingConfigError: the model's generators are not the checkpoint's.
        CorruptCheckpointError: a recorded state is malformed.
    """
    saved = meta.get(_SEED_STATES)
    if saved is None:
        return
    if not isinstance(saved, dict):
        raise CorruptCheckpointError(
            f"checkpoint {meta['path']}: its metadata {_json_path(meta['path'])} holds "
            f"malformed seed states: {saved!r}.")
    states = seed_states(model)
    if set(saved) != set(states):
        raise TrainingConfigError(
            f"checkpoint {meta['path']} does not match this model's random seed generators "
            f"(dropout, router jitter): {_key_difference(states, saved)}. {_HINT}")
    for key, variable in states.items():
        try:
            array = np.asarray(saved[key], dtype=variable.dtype).reshape(variable.shape)
        except (TypeError, ValueError, OverflowError):
            raise CorruptCheckpointError(
                f"checkpoint {meta['path']}: its metadata {_json_path(meta['path'])} holds "
                f"a malformed seed state {key!r}: {saved[key]!r}.") from None
        _assign_host(variable, array)


def _key_difference(states, saved):
    """A short account of how the model's seed-state keys differ from the saved ones."""
    parts = [f"the model has {len(states)}, the checkpoint {len(saved)}"]
    for what, keys in (("only in the model", set(states) - set(saved)),
                       ("only in the checkpoint", set(saved) - set(states))):
        if keys:
            parts.append(f"{what}: {', '.join(sorted(keys)[:3])}"
                         + (f" and {len(keys) - 3} more" if len(keys) > 3 else ""))
    return "; ".join(parts)


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
        meta = {"step": step, "batches_consumed": int(step if batches_consumed is None
                                                      else batches_consumed),
                "weights": os.path.basename(final), "time": time.time(),
                _SEED_STATES: read_seed_states(model), **fields, **(extra or {})}
        if self.primary:
            self._commit(meta)
        return meta

    def _write_weights(self, model, step):
        """`model.save_weights` to a fsynced temporary file in the folder; returns its path."""
        tmp = os.path.join(self.directory, f".tmp-{os.getpid()}-ckpt-{step:08d}.weights.h5")
        try:
            model.save_weights(tmp, overwrite=True)
            _fsync_file(tmp)
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
        atomic_write_text(os.path.join(self.directory, "checkpoint"),
                          json.dumps({"latest": os.path.basename(self.meta_path(step))}))
        self._prune()

    def all(self):
        """Committed checkpoints' metadata, oldest first (json present, weights present)."""
        out = []
        for path in glob.glob(os.path.join(self.directory, "ckpt-*.json")):
            if not _NAME.match(os.path.basename(path)):
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
        for meta in committed[:-self.keep]:
            for path in (meta["path"], self.meta_path(meta["step"])):
                _remove(path)
        keep = {os.path.basename(m["path"]) for m in committed[-self.keep:]}
        # Orphans: weights whose json never got written (a crash between the two).
        for suffix in _WEIGHTS_SUFFIXES:
            for path in glob.glob(os.path.join(self.directory, f"ckpt-*{suffix}")):
                if os.path.basename(path) not in keep:
                    stem = os.path.basename(path)[:-len(suffix)]
                    if not os.path.exists(os.path.join(self.directory, stem + ".json")):
                        _remove(path)
        # Orbax's own temporary folders of a save that never finished.
        tmp = glob.glob(os.path.join(self.directory, ".tmp-*")) + glob.glob(
            os.path.join(self.directory, "ckpt-*.orbax-checkpoint-tmp*"))
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
            "ckpt-*.weights.h5, or checkpoints/ of a model dir).")
    if not os.path.isfile(path):
        raise TrainingConfigError(f"`{argument}` {path!r} does not exist.")
    return path


def verify_checkpoint(meta):
    """Checks `meta["path"]` against the size and sha256 in its metadata.

    Raises `CorruptCheckpointError` naming the file (checkpoints written
    before checksums were recorded are only checked for existence).
    """
    path = meta["path"]
    json_path = _json_path(path)
    try:
        size = (sharded_checkpoint.folder_size(path) if os.path.isdir(path)
                else os.path.getsize(path))
    except OSError as e:
        raise CorruptCheckpointError(f"checkpoint {path} is unreadable: {e}") from None
    if "size" in meta and size != meta["size"]:
        raise CorruptCheckpointError(
            f"checkpoint {path} is truncated or corrupt: {size} bytes, its metadata "
            f"{json_path} says {meta['size']}.")
    if "sha256" in meta and file_sha256(path) != meta["sha256"]:
        raise CorruptCheckpointError(
            f"checkpoint {path} is corrupt: its sha256 does not match its metadata {json_path}.")


def _json_path(path):
    """The metadata file of the weights `path`."""
    for suffix in _WEIGHTS_SUFFIXES:
        if path.endswith(suffix):
            return path[:-len(suffix)] + ".json"
    return path


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
        k in text for k in ("unable to open", "truncated", "file signature", "bad object header",
                            "unable to synchronously open", "not a valid hdf5",
                            "can't open", "unable to read"))


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
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            if os.path.isdir(meta["path"]):
                sharded_checkpoint.restore(model, meta["path"])
            else:
                model.load_weights(meta["path"])
    except (ValueError, KeyError, OSError) as e:
        if _is_unreadable(e):
            raise CorruptCheckpointError(
                f"checkpoint {meta['path']} is unreadable (truncated or corrupt): {e}"
            ) from None
        raise TrainingConfigError(
            f"checkpoint {meta['path']} does not match this model/optimizer ({e}). {_HINT}"
        ) from None
    # Keras only warns when it skips variables (e.g. another optimizer): refuse that.
    skipped = [str(w.message) for w in caught if "Skipping variable loading" in str(w.message)]
    if skipped:
        raise TrainingConfigError(
            f"checkpoint {meta['path']} does not match this model/optimizer: "
            f"{skipped[0].strip()} {_HINT}")
    if seed_states:
        _restore_seed_states(model, meta)


class StepCheckpoint(keras.callbacks.Callback):
    """Saves a checkpoint every `every` optimizer steps (and at the end of training).

    Args:
        manager: a `CheckpointManager`.
        every: steps between checkpoints (>= 1).
        enabled: False on non-chief workers (they save nothing).
    """

    def __init__(self, manager, every, enabled=True, log=None):
        super().__init__()
        if not is_int(every) or every < 1:
            raise TrainingConfigError(f"`checkpoint_every` must be an integer >= 1, got {every!r}.")
        self.manager = manager
        self.every = every
        self.enabled = enabled
        self.last_saved = None
        self.log = log or default_log

    def _step(self):
        return int(keras.ops.convert_to_numpy(self.model.optimizer.iterations))

    def _save(self, step):
        if self.enabled and step != self.last_saved:
            self.manager.save(self.model, step)
            self.last_saved = step
            if self.manager.primary:
                self.log(f"saved checkpoint {self.manager.weights_path(step)}")

    def on_train_batch_end(self, batch, logs=None):
        step = self._step()
        if step % self.every == 0:
            self._save(step)

    def on_train_end(self, logs=None):
        self._save(self._step())


class PreemptionBackup(keras.callbacks.BackupAndRestore):
    """`keras.callbacks.BackupAndRestore` whose backups are atomic step checkpoints.

    Saving follows BackupAndRestore (`save_freq` batches or "epoch"; the backup
    is deleted when `fit` finishes). Restoring is done by the trainer before
    `fit`, from the newest of the backup and the step checkpoints, together
    with the data position; so `on_train_begin` here does not load anything.
    """

    def __init__(self, backup_dir, save_freq="epoch", enabled=True, sharded=False, primary=True):
        super().__init__(backup_dir, save_freq=save_freq, delete_checkpoint=True)
        self.manager = CheckpointManager(backup_dir, keep=1, sharded=sharded, primary=primary)
        self.enabled = enabled

    def on_train_begin(self, logs=None):
        pass

    def _save_model(self):
        if self.enabled:
            step = int(keras.ops.convert_to_numpy(self.model.optimizer.iterations))
            self.manager.save(self.model, step)

    def on_train_end(self, logs=None):
        if self.enabled and self.manager.primary:
            super().on_train_end(logs)
