"""A persistent XLA compilation cache for the compiled searches on JAX.

A first `generate` on JAX spends most of its time compiling the search loop
(about 3 s for the tiny Switch T5 on 2 CPU cores against 0.05 s for a warm
call). With JAX's persistent cache, a later process (a restarted notebook, the
next evaluation job) reads the executable from disk instead. The first JAX
search of a process turns the cache on unless the user has already chosen:

- `jax.config.jax_compilation_cache_dir` (or `JAX_COMPILATION_CACHE_DIR`)
  already set: left as it is;
- `KERAS_MOE_JAX_CACHE=off`: no cache;
- `KERAS_MOE_JAX_CACHE=/some/dir`: that directory;
- otherwise `$XDG_CACHE_HOME/keras_moe/jax` (default `~/.cache/keras_moe/jax`).

JAX's own thresholds still apply (it stores compilations that took at least
`jax_persistent_cache_min_compile_time_secs`, 1 s by default). The setting is
process-wide, so the cache then serves every later `jax.jit` too. Like any
JAX compilation cache, the directory is trusted code: keep it private.
"""

import os
import warnings
from collections.abc import Mapping

ENV_VARIABLE = "KERAS_MOE_JAX_CACHE"
OFF_VALUES = ("off", "0", "false", "no", "none")


def default_cache_dir(environ: Mapping[str, str] | None = None) -> str:
    """`$XDG_CACHE_HOME/keras_moe/jax`, or `~/.cache/keras_moe/jax`.

    Args:
        environ: the environment to read (default `os.environ`).

    Example:
    >>> default_cache_dir({"XDG_CACHE_HOME": "/cache"})
    '/cache/keras_moe/jax'
    """
    environ = os.environ if environ is None else environ
    base = environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "keras_moe", "jax")


def chosen_cache_dir(environ: Mapping[str, str] | None = None) -> str | None:
    """The directory `KERAS_MOE_JAX_CACHE` asks for: a path, the default, or None for off.

    Args:
        environ: the environment to read (default `os.environ`).

    Example:
    >>> chosen_cache_dir({"KERAS_MOE_JAX_CACHE": "off"}) is None
    True
    >>> chosen_cache_dir({"KERAS_MOE_JAX_CACHE": "/tmp/xla"})
    '/tmp/xla'
    """
    environ = os.environ if environ is None else environ
    value = environ.get(ENV_VARIABLE, "").strip()
    if value.lower() in OFF_VALUES:
        return None
    return value or default_cache_dir(environ)


def use_persistent_cache() -> str | None:
    """Turn JAX's persistent compilation cache on, unless the user has chosen.

    Returns:
        The cache directory in use (the user's own if they set one), or None
        when it is off.

    Example:
    >>> import keras
    >>> path = use_persistent_cache() if keras.backend.backend() == "jax" else None
    """
    import jax

    current = jax.config.jax_compilation_cache_dir  # type: ignore[attr-defined]  # a flag, set at run time
    if current:
        return current
    path = chosen_cache_dir()
    if path is None:
        return None
    try:
        os.makedirs(path, mode=0o700, exist_ok=True)
    except OSError as error:  # e.g. a read-only home: compile as before, say why once
        warnings.warn(
            f"keras_moe: no persistent JAX compilation cache at {path!r} ({error}); "
            f"set {ENV_VARIABLE} to a writable directory, or to 'off'.",
            stacklevel=2,
        )
        return None
    jax.config.update("jax_compilation_cache_dir", path)
    return path
