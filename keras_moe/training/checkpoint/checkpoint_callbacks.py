"""Keras callbacks that write checkpoints during `fit`: every N steps, and the preemption backup."""

import keras

from keras_moe.training.checkpoint.checkpoint_manager import CheckpointManager
from keras_moe.training.errors import TrainingConfigError
from keras_moe.training.log import log as default_log
from keras_moe.validation import is_int


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
