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
    """Parses gin files and bindings; returns the `T5Config` that they configure.

    Args:
        files: one gin file or a list of them: names found by `gin_path`
            ("switch_tiny", "switch_tiny.gin", "models/switch_tiny") or paths
            (str or `os.PathLike`) of files of your own.
        bindings: one gin binding ("NUM_EXPERTS = 4") or a list of them,
            applied after the files.
        finalize: lock the gin config after parsing.

    Returns:
        the `T5Config` bound to `build_model.config` (what `build_model()`
        would use), or None when the files bind no config.

    Example:
    >>> config = parse_gin("switch_tiny.gin", "NUM_EXPERTS = 4")
    >>> config.moe_type, config.num_experts
    ('switch', 4)
    >>> model = build_model()  # the same config, through gin
    >>> model.config.num_experts
    4
    """
    import os

    if isinstance(files, (str, os.PathLike)):
        files = [files]
    if isinstance(bindings, str):
        bindings = [bindings]
    add_search_paths()
    gin.parse_config_files_and_bindings([_gin_file(f) for f in files], list(bindings),
                                        finalize_config=finalize)
    try:
        configured = gin.query_parameter("build_model.config")
    except ValueError:  # the files bind no model config
        return None
    if isinstance(configured, gin.config.ConfigurableReference):
        return configured.scoped_configurable_fn()
    return configured


def _gin_file(name):
    """Path of a gin file given as a path of one's own or a name for `gin_path`."""
    import os

    name = os.fspath(name)
    if os.path.isfile(name) and (os.sep in name or "/" in name):
        return name
    try:
        return builder.gin_path(name)
    except ValueError:
        if os.path.isfile(name):  # a file in the current folder
            return name
        raise
