"""gin-configured training of keras_moe models, on TensorFlow or JAX.

`keras-moe-train` (module `keras_moe.training.cli`) calls `trainer.train`,
which runs a `run.Run` of a `train_config.TrainConfig` and its injected
collaborators: the data (`dataset_config.DatasetConfig`, seqio), the
checkpoints (`checkpoint_config.CheckpointConfig`: atomic step checkpoints,
keep last K, resume with the data position, preemption backup) and the
placement (`placement.StrategyPlacement`, a tf.distribute strategy, or
`placement.MeshPlacement`, a JAX device mesh). It writes TensorBoard runs and
expert-load plots. `keras-moe-eval` (`eval_cli`) evaluates a checkpoint;
`keras-moe-compile` (`compile_cli`) compiles a train step for a TPU slice.

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
