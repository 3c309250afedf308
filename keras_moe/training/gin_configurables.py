"""gin registrations of the training job (module `keras_moe.training`).

Run files write `train.batch_size = %BATCH_SIZE`, `train.optimizer = @make_optimizer()`,
`make_optimizer.name = "adam"` and so on; the model comes from
`keras_moe.models.gin_configurables` (`build_model`, `T5Config`).
"""

import os

import gin
import keras_moe.models.gin_configurables  # noqa: F401  (registers build_model, T5Config)
from keras_moe.training import schedules, trainer
from keras_moe.training.checkpoint import atomic_write_text

train = gin.external_configurable(trainer.train, name="train", module="keras_moe.training",
                                  denylist=["model_dir", "write_config"])
make_optimizer = gin.external_configurable(schedules.make_optimizer, name="make_optimizer",
                                           module="keras_moe.training")


@gin.configurable(module="keras_moe.training", denylist=["model_dir"])
def evaluate_config(model_dir=None, split="validation", eval_batches=20, decode_examples=32,
                    max_decode_length=None, beam_size=1):
    """Defaults of `keras-moe-eval` that a run file may set (`evaluate_config.split = ...`)."""
    return dict(split=split, eval_batches=eval_batches, decode_examples=decode_examples,
                max_decode_length=max_decode_length, beam_size=beam_size)


def write_operative_config(model_dir):
    """Writes `gin.operative_config_str()` to `model_dir/operative_config.gin` atomically."""
    path = os.path.join(model_dir, "operative_config.gin")
    atomic_write_text(path, gin.operative_config_str())
    return path
