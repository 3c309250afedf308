"""gin-configured training of keras_moe models, on TensorFlow or JAX.

`keras-moe-train` (`train_cli`) calls `trainer.train`, which runs a
`run.training_run.Run` of a `train_config.TrainConfig` and its injected
collaborators, each in its own folder:

* `run/`: the loop and its data (`run.dataset_config.DatasetConfig`, seqio),
  optimizer schedules, callbacks, expert-load plots and closing summary;
* `checkpoint/`: atomic step checkpoints, keep last K, resume with the data
  position, the preemption backup (`checkpoint.checkpoint_config.CheckpointConfig`);
* `placement/`: where the model lives (`placement.StrategyPlacement`, a
  tf.distribute strategy, or `placement.MeshPlacement`, a JAX device mesh).

`keras-moe-eval` (`eval_cli`) evaluates a checkpoint. Compiling a train step
for a TPU slice without one (`keras-moe-compile`) is `keras_moe.tpu_compile`.

The submodules import TensorFlow, seqio and the tasks lazily where they can,
so `keras_moe.training.run.schedules` and `.checkpoint` are cheap to import.
"""

import warnings as _warnings

from keras_moe import compat as _compat
from keras_moe.training.errors import TrainingConfigError
from keras_moe.training.run.schedules import InverseSqrtSchedule, make_optimizer

__all__ = ["InverseSqrtSchedule", "TrainingConfigError", "make_optimizer"]

for _untested in _compat.untested_versions():
    _warnings.warn(
        f"untested version: {_untested}. keras_moe.compat reaches private "
        "internals written for keras_moe.compat.TESTED_VERSIONS.",
        stacklevel=2,
    )
