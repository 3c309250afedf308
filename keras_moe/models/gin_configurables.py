"""gin registrations for the model library (the only module here that imports gin).

Registers `T5Config` and `build_model` (module `keras_moe.models`) so gin files
can write `build_model.config = @T5Config()` and `T5Config.d_model = %D_MODEL`.
`parse_gin` adds the gin folders to gin's search path, so includes such as
`include 'models/t5_1_1_base.gin'` resolve after install.
"""

import gin

from keras_moe.models import builder
from keras_moe.models import config as config_lib

T5Config = gin.external_configurable(config_lib.T5Config, name="T5Config",
                                     module="keras_moe.models")
build_model = gin.external_configurable(builder.build_model, name="build_model",
                                        module="keras_moe.models")


def add_search_paths():
    """Adds the gin folders to gin's include search path (idempotent).

    They go before gin's default '' (current directory) prefix when possible,
    so gin does not log a "Path not found" error for every include.
    """
    import os

    prefixes = getattr(gin.config, "_LOCATION_PREFIXES", None)
    for folder in reversed(builder.gin_dirs()):
        if not os.path.isdir(folder):
            continue
        if isinstance(prefixes, list):
            if folder not in prefixes:
                prefixes.insert(0, folder)
        else:  # pragma: no cover - future gin versions
            gin.add_config_file_search_path(folder)


def parse_gin(files=(), bindings=(), finalize=False):
    """Parses gin files (paths or names for `gin_path`) and bindings.

    Example:
    >>> parse_gin(["switch_tiny"], ["NUM_EXPERTS = 4"])
    >>> model = build_model()
    """
    add_search_paths()
    paths = [f if f.endswith(".gin") and "/" in f and __import__("os").path.isfile(f)
             else builder.gin_path(f) for f in files]
    gin.parse_config_files_and_bindings(paths, list(bindings), finalize_config=finalize)
