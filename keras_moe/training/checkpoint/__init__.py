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

The pieces live in their own modules and are re-exported here:
`atomic_files` (atomic writes, sha256), `checkpoint_names` (file names and
metadata fields), `rng_state` (seed-generator states), `checkpoint_manager`
(writing, listing, pruning), `checkpoint_restore` (finding, verifying,
loading) and `checkpoint_callbacks` (`StepCheckpoint`, `PreemptionBackup`).

Example:
>>> import shutil, tempfile
>>> import keras
>>> model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
>>> model.compile(optimizer="sgd", loss="mse")
>>> manager = CheckpointManager(tempfile.mkdtemp(), keep=1)
>>> _ = manager.save(model, step=5)
>>> newest = manager.latest()
>>> newest["step"], newest["weights"]
(5, 'ckpt-00000005.weights.h5')
>>> restore(model, newest)  # a compiled model; checks size and sha256 first
>>> shutil.rmtree(manager.directory)
"""

from keras_moe.training.checkpoint.atomic_files import (
    atomic_write_bytes,
    atomic_write_text,
    file_sha256,
)
from keras_moe.training.checkpoint.checkpoint_callbacks import PreemptionBackup, StepCheckpoint
from keras_moe.training.checkpoint.checkpoint_manager import CheckpointManager
from keras_moe.training.checkpoint.checkpoint_restore import (
    resolve_checkpoint,
    restore,
    restore_newest,
    verify_checkpoint,
)
from keras_moe.training.checkpoint.rng_state import read_seed_states, seed_states

__all__ = [
    "CheckpointManager",
    "PreemptionBackup",
    "StepCheckpoint",
    "atomic_write_bytes",
    "atomic_write_text",
    "file_sha256",
    "read_seed_states",
    "resolve_checkpoint",
    "restore",
    "restore_newest",
    "seed_states",
    "verify_checkpoint",
]
