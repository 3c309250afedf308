"""gin-configurable training for keras_moe on the TensorFlow backend.

`keras-moe-train` (module `keras_moe.training.cli`) builds the
`tf.distribute` strategy, the seqio dataset, the model and the optimizer from
gin, and runs `model.fit` with step checkpoints (atomic, keep last K, resume
with the data position), a preemption backup (`keras.callbacks.BackupAndRestore`),
TensorBoard scalars and an expert-load plot. `keras-moe-eval`
(`keras_moe.training.eval_cli`) evaluates a checkpoint.

The submodules import TensorFlow, seqio and the tasks lazily where they can,
so `keras_moe.training.schedules` and `.checkpoint` are cheap to import.
"""

import warnings as _warnings

from keras_moe import compat as _compat
from keras_moe.training.errors import TrainingConfigError
from keras_moe.training.schedules import InverseSqrtSchedule, make_optimizer

__all__ = ["InverseSqrtSchedule", "TrainingConfigError", "make_optimizer"]

for _untested in _compat.untested_versions():
    _warnings.warn(f"untested version: {_untested}. keras_moe.compat reaches private "
                   "internals written for keras_moe.compat.TESTED_VERSIONS.", stacklevel=2)
