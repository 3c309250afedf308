"""gin registrations of the training job (module `keras_moe.training`).

Run files inject the job's collaborators, as T5X's do:
`train.dataset = @DatasetConfig()` (`DatasetConfig.batch_size = %BATCH_SIZE`),
`train.checkpoint = @CheckpointConfig()`, `train.placement = @MeshPlacement()`
or `@StrategyPlacement()`, `train.optimizer = @make_optimizer`; the model comes
from `keras_moe.gin_config.model_configurables` (`build_model`, `T5Config`).
"""

import dataclasses
import os

import gin
import keras_moe.gin_config.model_configurables  # noqa: F401  (registers build_model, T5Config)
from keras_moe import gin_config
from keras_moe.training import trainer
from keras_moe.training.checkpoint.atomic_files import atomic_write_text
from keras_moe.training.checkpoint.checkpoint_config import CheckpointConfig
from keras_moe.training.checkpoint.upcycle_checkpoint import Upcycle
from keras_moe.training.placement import MeshPlacement, StrategyPlacement
from keras_moe.training.run import schedules
from keras_moe.training.run.dataset_config import DatasetConfig
from keras_moe.training.train_config import SHORTHANDS, TrainConfig

_MODULE = "keras_moe.training"
train = gin.external_configurable(
    trainer.train,
    name="train",
    module=_MODULE,
    denylist=["model_dir", "write_config", "return_config"],
)
make_optimizer = gin.external_configurable(
    schedules.make_optimizer, name="make_optimizer", module=_MODULE
)
for _cls in (DatasetConfig, CheckpointConfig, Upcycle, StrategyPlacement, MeshPlacement):
    gin.external_configurable(_cls, module=_MODULE)
# `train` takes **settings (the flat shorthands): gin would accept any name.
gin_config.register_keyword_names(
    "train", {f.name for f in dataclasses.fields(TrainConfig)} | set(SHORTHANDS)
)


def job_config():
    """The `TrainConfig` that `train` gets from the parsed gin (unchecked; collaborators
    None where unbound): how the compile and eval tools read the same job."""
    return train(None, return_config=True)


def write_operative_config(model_dir):
    """Writes `gin.operative_config_str()` to `model_dir/operative_config.gin` atomically."""
    path = os.path.join(model_dir, "operative_config.gin")
    atomic_write_text(path, gin.operative_config_str())
    return path
