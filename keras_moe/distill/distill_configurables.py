"""gin registration of `build_distiller` (module `keras_moe.distill`).

Run files write `build_distiller.teacher_checkpoint = %TEACHER_CHECKPOINT`,
`build_distiller.alpha = 0.25` and so on (see `gin/runs/distill.gin`).
"""

import gin
import keras_moe.training.train_configurables  # noqa: F401  (train, make_optimizer, T5Config)
from keras_moe.distill import distiller_builder

build_distiller = gin.external_configurable(
    distiller_builder.build_distiller,
    name="build_distiller",
    module="keras_moe.distill",
    denylist=["teacher"],
)
