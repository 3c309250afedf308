"""gin files by name, binding checks, import allow-list, and the operative config."""

import contextlib
import os

from keras_moe.training.errors import TrainingConfigError


def gin_search_dirs():
    """Folders searched for gin files, in order.

    `<package>/gin_files/` and `<repo>/gin/` (with their `runs/` and `models/`
    sub-folders), after the current directory.
    """
    from keras_moe.models import gin_dirs

    out = []
    for folder in gin_dirs():
        for sub in ("", "runs", "models"):
            path = os.path.join(folder, sub) if sub else folder
            if os.path.isdir(path) and path not in out:
                out.append(path)
    return out


def resolve_gin_file(name):
    """Path of a gin file given as a path or a name ("tiny_local.gin", "runs/tiny_local").

    Example:
    >>> resolve_gin_file("tiny_local.gin")  # found in the package's gin folder
    '.../runs/tiny_local.gin'
    """
    if os.path.isfile(name):
        return os.path.abspath(name)
    candidate = name if name.endswith(".gin") else name + ".gin"
    if os.path.isfile(candidate):
        return os.path.abspath(candidate)
    for folder in gin_search_dirs():
        path = os.path.join(folder, candidate)
        if os.path.isfile(path):
            return path
    raise TrainingConfigError(
        f"gin file {name!r} not found (looked in the current folder and {gin_search_dirs()}).")


def _macros():
    import gin

    return {name for (name, kind) in gin.config._CONFIG if kind == "gin.macro"}


def _split_bindings(bindings):
    out = []
    for item in bindings or ():
        for line in str(item).splitlines():
            if line.strip() and not line.strip().startswith("#"):
                out.append(line.strip())
    return out


# Modules (with their sub-modules) that gin `import` lines may name by default:
# they register this project's configurables and seqio tasks.
DEFAULT_GIN_IMPORTS = ("keras_moe", "tasks", "seqio", "t5.data", "t5.evaluation")


@contextlib.contextmanager
def gin_imports_allowed(extra=()):
    """While active, gin `import` lines may only name `DEFAULT_GIN_IMPORTS` + `extra`.

    An import runs the module's code, so a shared gin file could otherwise run
    anything importable. A refused import raises `TrainingConfigError` naming
    the line and the `--gin_allow_import` flag that allows it.

    Args:
        extra: more module names (each also allows its sub-modules).

    Example:
    >>> import os, shutil, tempfile
    >>> import gin
    >>> folder = tempfile.mkdtemp()
    >>> path = os.path.join(folder, "my_run.gin")
    >>> with open(path, "w") as f:
    ...     _ = f.write("import json.decoder")
    >>> with gin_imports_allowed():
    ...     gin.parse_config_file(path)
    Traceback (most recent call last):
    ...
    keras_moe.training.errors.TrainingConfigError: gin import 'import json.decoder'
    (...my_run.gin:1) is not allowed: ... allow it with --gin_allow_import json...
    >>> with gin_imports_allowed(["json"]):  # json and its sub-modules
    ...     gin.parse_config_file(path).imports
    ['json.decoder']
    >>> shutil.rmtree(folder)
    """
    import gin.config

    allowed = tuple(DEFAULT_GIN_IMPORTS) + tuple(m.strip() for m in extra if m.strip())
    original = gin.config.ParseContext.process_import

    def checked(self, statement):
        module = statement.module  # "a.b" for both `import a.b` and `from a import b`
        if not any(module == a or module.startswith(a + ".") for a in allowed):
            where = f"{statement.location.filename}:{statement.location.line_num}"
            raise TrainingConfigError(
                f"gin import {statement.format()!r} ({where}) is not allowed: gin files may "
                f"import only {list(allowed)} and their sub-modules. If you trust it, allow "
                f"it with --gin_allow_import {module.split('.')[0]}.")
        return original(self, statement)

    gin.config.ParseContext.process_import = checked
    try:
        yield
    finally:
        gin.config.ParseContext.process_import = original


def _file_list(files):
    """`files` (one name or path, or a list of them) as a list of str."""
    allowed = "a gin file name or path (str or os.PathLike), or a list of them"
    if files is None:
        return []
    if isinstance(files, (str, os.PathLike)):
        files = [files]
    elif not isinstance(files, (list, tuple)):
        raise TrainingConfigError(f"`files` must be {allowed}, got {files!r}.")
    out = []
    for f in files:
        name = os.fspath(f) if isinstance(f, (str, os.PathLike)) else None
        if not isinstance(name, str):
            raise TrainingConfigError(
                f"`files` must be {allowed}; the list holds {f!r} ({type(f).__name__}).")
        out.append(name)
    return out


def parse_gin(files, bindings=(), allowed_imports=()):
    """Parses gin files (names or paths) then bindings, with clear errors.

    A binding of an undefined macro (`BATCH_SIZ = 4`, a typo gin would accept
    silently) or of an unknown configurable/parameter raises
    `TrainingConfigError` naming it and listing the known macros; so does an
    `import` of a module outside `DEFAULT_GIN_IMPORTS` + `allowed_imports`.

    Args:
        files: one gin file or a list of them: names found by
            `resolve_gin_file` ("tiny_local.gin", "runs/tiny_local") or paths
            (str or `os.PathLike`).
        bindings: one gin binding ("BATCH_SIZE = 4") or a list of them,
            applied after the files.
        allowed_imports: module names gin `import` lines may name besides
            `DEFAULT_GIN_IMPORTS`.

    Example:
    >>> import gin
    >>> parse_gin("tiny_local.gin", "BATCH_SIZE = 4")
    >>> gin.query_parameter("%BATCH_SIZE")
    4
    """
    import gin

    import keras_moe.training.gin_configurables  # noqa: F401
    from keras_moe.models import gin_configurables as model_gin

    files = _file_list(files)
    if isinstance(bindings, str):
        bindings = [bindings]
    model_gin.add_search_paths()  # includes are relative to the gin/ folders
    paths = [resolve_gin_file(f) for f in files]
    with gin_imports_allowed(allowed_imports):
        try:
            for path in paths:
                gin.parse_config_file(path)
        except TrainingConfigError:
            raise
        except (ValueError, IOError, SyntaxError) as e:
            raise TrainingConfigError(f"bad gin file: {e}") from None
        _parse_bindings(files, bindings)


def _parse_bindings(files, bindings):
    import gin

    known = _macros()
    for binding in _split_bindings(bindings):
        lhs = binding.split("=", 1)[0].strip()
        if "=" not in binding:
            raise TrainingConfigError(f"gin binding {binding!r} is not of the form NAME = VALUE.")
        if "." not in lhs and "/" not in lhs and lhs not in known:
            raise TrainingConfigError(
                f"gin binding {binding!r}: macro {lhs!r} is not defined by the gin files "
                f"{files}; known macros: {sorted(known)}.")
        try:
            gin.parse_config(binding)
        except (ValueError, SyntaxError) as e:
            raise TrainingConfigError(f"gin binding {binding!r}: {e}") from None


def write_operative_config(model_dir):
    """Writes `gin.operative_config_str()` to `model_dir/operative_config.gin` atomically."""
    import gin

    from keras_moe.training.checkpoint import atomic_write_text

    path = os.path.join(model_dir, "operative_config.gin")
    atomic_write_text(path, gin.operative_config_str())
    return path
