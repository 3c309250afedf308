"""The one gin front end of keras_moe: finding, parsing and checking gin files.

Gin files live in `gin/` (installed as `keras_moe/gin_files/`): model files
in `models/` bind only the `T5Config` fields that differ from its defaults,
run files in `runs/` include a model file and `runs/defaults.gin` and bind
the run's macros (T5X's layout). Everything that parses gin goes through
`parse_gin`: file names resolved in one place, `import` lines limited to an
allow-list, bindings of unknown macros and `%gin.REQUIRED` macros left
unbound reported by name.
"""

from __future__ import annotations

import contextlib
import os
import tokenize
from collections.abc import Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

from keras_moe import compat
from keras_moe.gin_config import unread as gin_unread
from keras_moe.gin_config.errors import GinConfigError, describe_syntax_error

if TYPE_CHECKING:
    from keras_moe.models.config import T5Config

# Modules (with their sub-modules) that gin `import` lines may name by default:
# they register this project's configurables and seqio tasks.
DEFAULT_GIN_IMPORTS = ("keras_moe", "seqio", "t5.data", "t5.evaluation")

# Modules that register gin configurables under an earlier name: the
# `operative_config.gin` of an older run imports them by that name.
RENAMED_GIN_IMPORTS = {
    "keras_moe.training.gin_configurables": "keras_moe.training.train_configurables",
    "keras_moe.models.gin_configurables": "keras_moe.gin_config.model_configurables",
    "keras_moe.distill.gin_configurables": "keras_moe.distill.distill_configurables",
}


def gin_dirs() -> list[str]:
    """Folders holding gin files: `<package>/gin_files/` then `<repo>/gin/` (a checkout)."""
    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    return [os.path.join(package, "gin_files"), os.path.join(os.path.dirname(package), "gin")]


def search_dirs() -> list[str]:
    """Folders searched for a gin file name, in order: each of `gin_dirs()` and its
    `runs/` and `models/` sub-folders (those that exist)."""
    out: list[str] = []
    for folder in gin_dirs():
        for path in (folder, os.path.join(folder, "runs"), os.path.join(folder, "models")):
            real = os.path.realpath(path)
            if os.path.isdir(path) and real not in (os.path.realpath(p) for p in out):
                out.append(path)
    return out


def resolve(name: str | os.PathLike[str]) -> str:
    """Path of a gin file given as a path, or by name in the gin folders.

    A path that exists (relative to the current folder, or absolute) wins;
    otherwise `name` (".gin" added if missing) is looked up in `search_dirs()`,
    so "tiny_local", "runs/tiny_local.gin" and "switch_tiny" all resolve.

    Args:
        name: str or `os.PathLike`.

    Returns:
        the absolute path.

    Example:
    >>> resolve("tiny_local")
    '.../runs/tiny_local.gin'
    >>> resolve("models/switch_tiny") == resolve("switch_tiny.gin")
    True
    """
    name = os.fspath(name)
    candidate = name if name.endswith(".gin") else name + ".gin"
    for path in (name, candidate):
        if os.path.isfile(path):
            return os.path.abspath(path)
    for folder in search_dirs():
        path = os.path.join(folder, candidate)
        if os.path.isfile(path):
            return os.path.abspath(path)
    raise GinConfigError(
        f"gin file {name!r} not found: looked for {candidate!r} in the "
        f"current folder and in {search_dirs()}."
    )


def add_search_paths() -> None:
    """Lets gin `include` lines name files relative to the gin folders (idempotent).

    The folders go before gin's default '' (current folder) prefix, so gin does
    not log a "Path not found" error for every include.
    """
    import gin.config

    prefixes = getattr(gin.config, "_LOCATION_PREFIXES", None)
    for folder in reversed(gin_dirs()):
        if not os.path.isdir(folder):
            continue
        if isinstance(prefixes, list):
            if folder not in prefixes:
                prefixes.insert(0, folder)
        else:  # pragma: no cover - future gin versions
            gin.add_config_file_search_path(folder)


@contextlib.contextmanager
def imports_allowed(extra: Iterable[str] = ()) -> Iterator[None]:
    """While active, gin `import` lines may only name `DEFAULT_GIN_IMPORTS` + `extra`.

    An import runs the module's code, so a shared gin file could otherwise run
    anything importable. A refused import raises `GinConfigError` naming the
    line and the `--gin_allow_import` flag that allows it. A module named in
    `RENAMED_GIN_IMPORTS` is imported by its new name.

    Args:
        extra: more module names (each also allows its sub-modules).

    Example:
    >>> import os, shutil, tempfile
    >>> import gin
    >>> folder = tempfile.mkdtemp()
    >>> path = os.path.join(folder, "my_run.gin")
    >>> with open(path, "w") as f:
    ...     _ = f.write("import json.decoder")
    >>> with imports_allowed():
    ...     gin.parse_config_file(path)
    Traceback (most recent call last):
    ...
    keras_moe.gin_config.errors.GinConfigError: gin import 'import json.decoder'
    (...my_run.gin:1) is not allowed: ... allow it with --gin_allow_import json...
    >>> with imports_allowed(["json"]):  # json and its sub-modules
    ...     gin.parse_config_file(path).imports
    ['json.decoder']
    >>> shutil.rmtree(folder)
    """

    allowed = tuple(DEFAULT_GIN_IMPORTS) + tuple(m.strip() for m in extra if m.strip())

    def check(statement):
        module = statement.module  # "a.b" for both `import a.b` and `from a import b`
        if not any(module == a or module.startswith(a + ".") for a in allowed):
            where = f"{statement.location.filename}:{statement.location.line_num}"
            raise GinConfigError(
                f"gin import {statement.format()!r} ({where}) is not allowed: gin files may "
                f"import only {list(allowed)} and their sub-modules. If you trust it, allow "
                f"it with --gin_allow_import {module.split('.')[0]}."
            )
        if module in RENAMED_GIN_IMPORTS:
            return statement._replace(module=RENAMED_GIN_IMPORTS[module])
        return None

    with compat.gin_import_hook(check):
        yield


def _as_list(value: Any, what: str, allowed: str) -> list[str]:
    if value is None:
        return []
    if isinstance(value, (str, os.PathLike)):
        return [os.fspath(value)]
    if not isinstance(value, (list, tuple)):
        raise GinConfigError(f"`{what}` must be {allowed}, got {value!r}.")
    for item in value:
        if not isinstance(item, (str, os.PathLike)):
            raise GinConfigError(
                f"`{what}` must be {allowed}; the list holds {item!r} ({type(item).__name__})."
            )
    return [os.fspath(item) for item in value]


# Settings that were macros of runs/defaults.gin, each forwarded to one binding;
# they are bound where they are read now. A run file or flag that still sets such
# a macro, and nothing reads it, would set nothing: it is refused, naming the
# binding to use instead.
RETIRED_MACROS = {
    **{
        name.upper(): f"train.{name}"
        for name in (
            "log_every",
            "steps_per_epoch",
            "steps_per_execution",
            "expert_load_every",
            "summary_batches",
            "dtype_policy",
        )
    },
    **{name.upper(): f"DatasetConfig.{name}" for name in ("pack", "seed", "input_shards")},
    "CHECKPOINT_EVERY": "CheckpointConfig.every",
    "KEEP_CHECKPOINTS": "CheckpointConfig.keep",
    "BACKUP_EVERY": "CheckpointConfig.backup_every",
    "STRATEGY": "StrategyPlacement.strategy",
    "TPU_NAME": "StrategyPlacement.tpu_name",
    "MESH_SHAPE": "MeshPlacement.mesh_shape",
    "LOGICAL_AXIS_RULES": "MeshPlacement.logical_axis_rules",
    "OPTIMIZER": "make_optimizer.name",
    "LEARNING_RATE": "make_optimizer.learning_rate",
    "LR_SCHEDULE": "make_optimizer.schedule",
    "WARMUP_STEPS": "make_optimizer.warmup_steps",
}

# Configurables that take **kwargs, which gin accepts under any parameter name
# (`train` takes the flat settings of earlier run files so): the names each
# accepts, checked once the gin is parsed (`register_keyword_names`).
KEYWORD_NAMES: dict[str, frozenset[str]] = {}


def register_keyword_names(configurable: str, names: Iterable[str]) -> None:
    """Declares the parameter names gin bindings of `configurable` may use.

    Args:
        configurable: the gin name, e.g. "train".
        names: every accepted parameter name.
    """
    KEYWORD_NAMES[configurable] = frozenset(names)


def _refuse_unknown_keywords():
    import gin

    for configurable, allowed in KEYWORD_NAMES.items():
        try:
            bound = gin.get_bindings(configurable)
        except ValueError:  # not registered in this process
            continue
        unknown = sorted(set(bound) - allowed)
        if unknown:
            raise GinConfigError(
                f"gin binding {configurable}.{unknown[0]}: {configurable} has no parameter "
                f"{unknown[0]!r}; it takes {', '.join(sorted(allowed))}."
            )


def _refuse_model_decided_bindings():
    """A binding of an argument the model sets on its MoE layers itself (`causal`,
    `dtype`, ...) would be recorded as applied and then dropped: refused by name."""
    # keras_moe.models' __init__ imports this module: its modules load when called.
    from keras_moe.models.model_decided import (  # noqa: PLC0415
        MODEL_DECIDED,
        model_decided_error,
    )

    layers = {
        f"keras_moe.{name}"
        for name in ("SwitchFeedForward", "GShardFeedForward", "TopKFeedForward", "MoeLayer")
    }
    for (scope, selector), parameters in sorted(compat.gin_bound_parameters().items()):
        decided = [p for p in parameters if p in MODEL_DECIDED]
        if selector in layers and decided:
            short = selector.rsplit(".", 1)[-1]
            binding = f"{scope}/{short}" if scope else short
            raise GinConfigError(
                model_decided_error(decided[0], f"gin binding {binding}.{decided[0]}")
            )


def _retired_macro_error(name, where):
    return GinConfigError(
        f"{where}: {name} is no longer a macro, so binding it would change nothing; "
        f"bind {RETIRED_MACROS[name]} instead "
        f"(e.g. --gin_bindings='{RETIRED_MACROS[name]} = ...')."
    )


def _refuse_unread_retired_macros(paths):
    # Checked once everything is parsed: a later file or binding may read a macro
    # that an earlier file defines.

    retired = sorted(set(RETIRED_MACROS) & _macros() - compat.gin_macro_references())
    if retired:
        raise _retired_macro_error(retired[0], f"gin file {', '.join(paths)}")


def _macros():
    return compat.gin_macro_names()


def _binding_lines(bindings):
    return [
        line.strip()
        for item in bindings
        for line in item.splitlines()
        if line.strip() and not line.strip().startswith("#")
    ]


def _parse_binding(binding, files, skip_unknown):
    import gin

    if "=" not in binding:
        raise GinConfigError(f"gin binding {binding!r} is not of the form NAME = VALUE.")
    lhs = binding.split("=", 1)[0].strip()
    if "." not in lhs and "/" not in lhs and lhs not in _macros():
        if lhs in RETIRED_MACROS:
            raise _retired_macro_error(lhs, f"gin binding {binding!r}")
        # gin would accept a new macro silently: a typo of a real one.
        raise GinConfigError(
            f"gin binding {binding!r}: macro {lhs!r} is not defined by the gin files "
            f"{files}; known macros: {sorted(_macros())}."
        )
    try:
        gin.parse_config(binding, skip_unknown=skip_unknown)
    except (SyntaxError, tokenize.TokenError) as e:
        raise GinConfigError(
            f"gin binding {binding!r}: {describe_syntax_error(binding, e)}"
        ) from None
    except ValueError as e:
        raise GinConfigError(f"gin binding {binding!r}: {e}") from None


def unbound_required_macros() -> list[str]:
    """Macros still bound to `%gin.REQUIRED` (a file said a value must be given)."""
    import gin.config

    import gin

    def is_required(value):
        return (
            isinstance(value, gin.config.ConfigurableReference)
            and value.selector == "gin.constant"
            and value.scoped_configurable_fn() is gin.REQUIRED
        )

    return sorted(name for name in _macros() if is_required(compat.gin_macro_value(name)))


def _configured_model():
    import gin

    try:
        configured = gin.query_parameter("build_model.config")
    except ValueError:  # the files bind no model config
        return None
    if isinstance(configured, gin.config.ConfigurableReference):
        try:
            return configured.scoped_configurable_fn()
        except (TypeError, ValueError) as e:  # T5Config's own checks, named by gin
            raise GinConfigError(f"the gin files configure an invalid model: {e}") from None
    return configured


GinFiles = str | os.PathLike[str] | Sequence[str | os.PathLike[str]]


def parse_gin(
    files: GinFiles = (),
    bindings: str | Sequence[str] = (),
    allowed_imports: Iterable[str] = (),
    finalize: bool = False,
    skip_unknown: bool = False,
    check_required: bool = True,
    clear: bool = True,
    check_unread: bool = True,
) -> T5Config | None:
    """Parses gin files, then bindings, with errors that name what is wrong.

    Args:
        files: one gin file or a list of them: names found by `resolve`
            ("switch_tiny", "tiny_local.gin", "runs/tiny_local") or paths (str
            or `os.PathLike`).
        bindings: one gin binding ("SwitchFeedForward.num_experts = 4", "BATCH_SIZE = 8")
            or a list of them, applied after the files. Binding a macro that no
            file defines (a typo gin would take silently) is an error.
        allowed_imports: module names gin `import` lines may name besides
            `DEFAULT_GIN_IMPORTS`.
        finalize: lock the gin config afterwards.
        skip_unknown: ignore bindings of configurables that are not registered.
        check_required: raise if a macro is still `%gin.REQUIRED`.
        clear: start from an empty gin config, so a notebook's second call does
            not inherit the first one's bindings; False adds to the config.
        check_unread: once the model's `T5Config` is made, refuse bindings of
            its configurables that nothing read (`keras_moe.gin_config.unread`), e.g.
            `SwitchFeedForward.num_experts` on a GShard model.

    Gin files from before the sparse-FFN spec (flat `T5Config.moe_type`,
    `T5Config.num_experts`, ... fields, as old `operative_config.gin` files
    hold them) are translated to the spec (`keras_moe.gin_config.flat_moe_gin`).

    Returns:
        the `T5Config` bound to `build_model.config` (what `build_model()`
        builds), or None when the files bind no model.

    Raises:
        GinConfigError: a file not found or invalid, a refused import, a bad
            binding, a required macro left unbound, or a binding of the model
            that nothing read.

    Example:
    >>> config = parse_gin("switch_tiny.gin", "SwitchFeedForward.num_experts = 4")
    >>> config.sparse_ffn["class_name"], config.num_experts, config.d_model
    ('keras_moe>SwitchFeedForward', 4, 64)
    >>> from keras_moe.gin_config.model_configurables import build_model
    >>> build_model().config.num_experts  # the same config, through gin
    4
    """
    import gin
    import keras_moe.gin_config.model_configurables  # noqa: F401  (T5Config, build_model)
    from keras_moe.gin_config import flat_moe_gin  # noqa: PLC0415  (models imports this module)

    files = _as_list(
        files, "files", "a gin file name or path (str or os.PathLike), or a list of them"
    )
    bindings = _as_list(bindings, "bindings", "a gin binding string, or a list of them")
    paths = [resolve(f) for f in files]
    if clear:
        gin.clear_config()
    add_search_paths()  # includes name files relative to the gin folders
    flat_fields = flat_moe_gin.FlatFieldBindings()
    with imports_allowed(allowed_imports), compat.gin_binding_hook(flat_fields.intercept):
        for path in paths:
            try:
                gin.parse_config_file(path, skip_unknown=skip_unknown)
            except GinConfigError:
                raise
            except (SyntaxError, tokenize.TokenError) as e:
                source = getattr(e, "filename", None) or path  # an included file's own
                with open(source, encoding="utf-8") as f:
                    where = describe_syntax_error(f.read(), e)
                raise GinConfigError(f"bad gin file {source}: {where}") from None
            except (ValueError, IOError) as e:
                raise GinConfigError(f"bad gin file {path}: {e}") from None
        for binding in _binding_lines(bindings):
            _parse_binding(binding, files, skip_unknown)
    flat_moe_gin.apply(flat_fields)
    _refuse_unread_retired_macros(paths)
    _refuse_unknown_keywords()
    _refuse_model_decided_bindings()
    missing = unbound_required_macros() if check_required else []
    if missing:
        raise GinConfigError(
            f"the gin files {files} require a value for {missing}: bind each in a gin file "
            f"or with --gin_bindings='{missing[0]} = ...'."
        )
    if finalize:
        gin.finalize()
    config = _configured_model()
    if check_unread and config is not None:
        gin_unread.refuse_unread_model_bindings(config)
    return config
