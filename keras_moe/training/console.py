"""A readable console for the command-line tools: short progress lines.

(Their start-up noise is filtered by `keras_moe.startup`.)

* `CompactProgbar`: Keras' progress bar showing loss, accuracy and the
  learning rate; the per-layer router statistics go to `router_table` (printed
  by the training logger every `train.log_every` steps) and TensorBoard
  instead of one very long line.
"""

import keras

from keras_moe.models import progress
from keras_moe.models.progress import ROUTER_COLUMNS, router_table, short_logs  # noqa: F401
from keras_moe.training.run import schedules


class CompactProgbar(progress.CompactProgbar):
    """`keras_moe.models.progress.CompactProgbar` with the learning rate in the bar and
    no table of its own (the training logger prints it).
    """

    def __init__(self):
        super().__init__(epoch_table=False)

    def learning_rate(self):
        optimizer = self.model.optimizer
        step = int(keras.ops.convert_to_numpy(optimizer.iterations))
        return schedules.learning_rate_at(optimizer, step)
