"""gin registrations for the model library (module `keras_moe.models`).

Registers `T5Config` and `build_model` so gin files can write
`build_model.config = @T5Config()` and `T5Config.d_model = 512` (see
`gin/models/`). Parsing is `keras_moe.gin_config.parse_gin`.
"""

import gin

from keras_moe.models import builder
from keras_moe.models import config as config_lib

T5Config = gin.external_configurable(config_lib.T5Config, name="T5Config",
                                     module="keras_moe.models")
build_model = gin.external_configurable(builder.build_model, name="build_model",
                                        module="keras_moe.models")
