"""Every use of another library's private internals, in one place.

keras_moe needs a few things that Keras, gin and TensorFlow do not expose
publicly. Each is reached through one function here, written for the versions
in `TESTED_VERSIONS` and checked by `tests/test_compat.py`, so an upgrade that
moves one fails there, by name, instead of somewhere deep in a training run.
`untested_versions()` lists the installed versions outside those series;
`keras_moe.training` warns about them once.

- Keras: `sublayers` (`Layer._flatten_layers`), `direct_sublayers`
  (`Layer._layers`), `seed_generators` (`Layer._seed_generators`),
  `PerThreadLosses` (overrides `Layer._losses`, where `add_loss` stores),
  `variable_layout` / `set_variable_layout` (`Variable._layout`),
  `learning_rate_schedule` (`Optimizer._learning_rate`), `current_layer_path`
  (`keras.src.backend.common.name_scope`),

  `without_backend_state` (drops what a `StatelessScope` leaves in Keras's
  global list of variables to initialise).
- gin: `gin_macro_names` / `gin_macro_references` / `gin_macro_value` /
  `gin_bound_parameters` (`gin.config._CONFIG`), `gin_called_configurables`
  (`gin.config._OPERATIVE_CONFIG`), `gin_import_hook` (wraps
  `ParseContext.process_import`), `gin_binding_hook` (wraps `gin.config.bind_parameter`
  as the parser calls it).
- TensorFlow: `tf_xla_sharding`, `tf_tpu_ops`, `tf_in_xla_context`,
  `tf_collective_health_timeout`, `tf_runtime_started` (`tensorflow.python.*`).

Example:
>>> import keras
>>> outer = keras.Sequential([keras.layers.Dense(2), keras.Sequential([keras.layers.Dense(1)])])
>>> sorted(type(layer).__name__ for layer in sublayers(outer))
['Dense', 'Dense', 'Sequential']
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import threading
from collections.abc import Callable, Iterator, Mapping
from types import ModuleType
from typing import TYPE_CHECKING, Any

import keras
from keras.src.backend.common import global_state, name_scope

if TYPE_CHECKING:
    import keras

# Distribution -> the release series ("major.minor") these helpers were written for.
TESTED_VERSIONS = {"keras": "3.15", "gin-config": "0.5", "tensorflow": "2.21"}


def untested_versions(installed: Mapping[str, str] | None = None) -> list[str]:
    """`["name X.Y.Z (tested: A.B)", ...]` for installed versions outside `TESTED_VERSIONS`.

    Args:
        installed: optional `{name: version}` (default: the environment's).

    Example:
    >>> untested_versions({"keras": "3.15.2", "gin-config": "0.6.0", "tensorflow": "2.21.0"})
    ['gin-config 0.6.0 (tested: 0.5)']
    """
    out = []
    for name, series in TESTED_VERSIONS.items():
        if installed is not None:
            version = installed.get(name)
        else:
            try:
                version = importlib.metadata.version(name)
            except importlib.metadata.PackageNotFoundError:
                version = None
        if version is not None and ".".join(version.split(".")[:2]) != series:
            out.append(f"{name} {version} (tested: {series})")
    return out


# --- Keras ------------------------------------------------------------------------------


def sublayers(layer: keras.layers.Layer) -> list[keras.layers.Layer]:
    """Every layer inside `layer`, depth first, `layer` itself left out."""
    return list(layer._flatten_layers(include_self=False, recursive=True))


def direct_sublayers(layer: keras.layers.Layer) -> list[keras.layers.Layer]:
    """The layers `layer` tracks directly, in creation order."""
    return list(getattr(layer, "_layers", ()))


def seed_generators(layer: keras.layers.Layer) -> list[keras.random.SeedGenerator]:
    """The `keras.random.SeedGenerator`s `layer` itself owns, in creation order."""
    return list(getattr(layer, "_seed_generators", ()))


def variable_layout(variable: keras.Variable) -> Any:
    """The layout a variable was given when it was created under a distribution, or None."""
    return getattr(variable, "_layout", None)


def set_variable_layout(variable: keras.Variable, layout: Any) -> None:
    """Gives an uninitialised variable the layout initialising it would (compile-only runs)."""
    variable._layout = layout


@contextlib.contextmanager
def without_backend_state() -> Iterator[None]:
    """Layers made inside get variables that are never initialised: no backend
    tensor is created, so TensorFlow's runtime is not started (a runtime that
    has started can no longer be set up for multi-worker collectives).
    Only for throwaway layers, such as one made to validate arguments."""

    before = list(global_state.get_global_attribute("uninitialized_variables", []))
    try:
        with keras.StatelessScope(initialize_variables=False):
            yield
    finally:
        global_state.set_global_attribute("uninitialized_variables", before)


def current_layer_path() -> str:
    """The name-scope path of the Keras layer being called ("" outside any layer)."""

    return name_scope.current_path()


def learning_rate_schedule(optimizer: keras.optimizers.Optimizer) -> Any:
    """The optimizer's learning rate as given (a schedule stays a schedule)."""
    return getattr(optimizer, "_learning_rate", optimizer.learning_rate)


class PerThreadLosses:
    """Mixin for a Keras layer: each thread gets its own `add_loss` list.

    Keras keeps a layer's `add_loss` results in one list (`Layer._losses`).
    Under MirroredStrategy every replica runs `call` in its own thread, and
    replicas that wait for each other in the middle of `call` (expert-parallel
    experts) would mix their losses in one shared list.
    """

    @property
    def _losses(self):
        per_thread = self.__dict__.setdefault("_per_thread_losses", {})
        return per_thread.setdefault(threading.get_ident(), [])

    @_losses.setter
    def _losses(self, value):
        per_thread = self.__dict__.setdefault("_per_thread_losses", {})
        per_thread[threading.get_ident()] = list(value)


# --- gin --------------------------------------------------------------------------------


def gin_macro_names() -> set[str]:
    """The names of the macros gin has parsed so far."""
    import gin.config

    return {name for (name, kind) in gin.config._CONFIG if kind == "gin.macro"}


def gin_macro_references() -> set[str]:
    """The names of the macros that some parsed binding (or macro) refers to as `%NAME`."""
    import gin.config

    found, pending = set(), [v for values in gin.config._CONFIG.values() for v in values.values()]
    while pending:
        value = pending.pop()
        if isinstance(value, gin.config.ConfigurableReference):
            if value.selector == "gin.macro":
                found.add(value.scoped_selector.rsplit("/", 1)[0])
        elif isinstance(value, dict):
            pending += list(value.keys()) + list(value.values())
        elif isinstance(value, (list, tuple, set, frozenset)):
            pending += list(value)
    return found


def gin_macro_value(name: str) -> Any:
    """The parsed value of macro `name` (a `ConfigurableReference` for `%gin.REQUIRED`)."""
    import gin.config

    return gin.config._CONFIG[(name, "gin.macro")].get("value")


def gin_bound_parameters() -> dict[tuple[str, str], list[str]]:
    """`{(scope, selector): [parameter, ...]}` of every parsed binding of a configurable
    (macros left out); `selector` is the configurable's full name, e.g.
    `("encoder", "keras_moe.SwitchFeedForward")`."""
    import gin.config

    return {
        key: sorted(values)
        for key, values in gin.config._CONFIG.items()
        if key[1] != "gin.macro" and values
    }


def gin_called_configurables() -> set[tuple[str, str]]:
    """`{(scope, selector), ...}` of the configurables gin has called since the config
    was last cleared; `scope` is the scope active at the call ("" for none)."""
    import gin.config

    with gin.config._OPERATIVE_CONFIG_LOCK:
        return set(gin.config._OPERATIVE_CONFIG)


@contextlib.contextmanager
def gin_binding_hook(intercept: Callable[[str, str, str, Any], bool]) -> Iterator[None]:
    """While active, `intercept(scope, selector, name, value)` sees each binding the gin
    parser makes before gin does; a True return takes the binding out of gin's config.

    Args:
        intercept: `intercept(scope, selector, name, value) -> bool`; `selector` as
            written in the file ("T5Config" or "keras_moe.models.T5Config").
    """
    import gin.config

    original = gin.config.bind_parameter

    def hooked(binding_key, value):
        if isinstance(binding_key, (list, tuple)) and len(binding_key) == 3:
            scope, selector, name = binding_key
            if selector != "gin.macro" and intercept(scope, selector, name, value):
                return None
        return original(binding_key, value)

    gin.config.bind_parameter = hooked
    try:
        yield
    finally:
        gin.config.bind_parameter = original


@contextlib.contextmanager
def gin_import_hook(check: Callable[[Any], Any]) -> Iterator[None]:
    """Calls `check(statement)` before gin processes each `import` of a parsed file.

    Args:
        check: `check(statement)`; raise to refuse the import, or return the
            statement gin processes instead (None: this one). `statement.module`
            is the module ("a.b"), `statement.location` where it was written.
    """
    import gin.config

    original = gin.config.ParseContext.process_import

    def checked(self, statement):
        return original(self, check(statement) or statement)

    gin.config.ParseContext.process_import = checked
    try:
        yield
    finally:
        gin.config.ParseContext.process_import = original


# --- TensorFlow -------------------------------------------------------------------------


def tf_xla_sharding() -> ModuleType:
    """TensorFlow's `xla_sharding` module (`mesh_split` annotations for TPU SPMD)."""
    from tensorflow.python.compiler.xla.experimental import xla_sharding

    return xla_sharding


def tf_tpu_ops() -> ModuleType:
    """TensorFlow's `tpu_ops` module (`all_to_all` with a registered gradient)."""
    from tensorflow.python.tpu.ops import tpu_ops

    return tpu_ops


def tf_in_xla_context() -> bool:
    """True while TensorFlow traces a function for XLA (`jit_compile=True`)."""
    import tensorflow as tf
    from tensorflow.python.ops import control_flow_util

    return control_flow_util.GraphOrParentsInXlaContext(tf.compat.v1.get_default_graph())


def tf_runtime_started() -> bool:
    """True once TensorFlow's eager runtime exists (the first op, variable or
    logical-device query makes it); before that it can still be configured."""
    from tensorflow.python.eager import context

    return context.context()._context_handle is not None


@contextlib.contextmanager
def tf_collective_health_timeout(seconds: float | None) -> Iterator[None]:
    """MultiWorkerMirroredStrategy's start-up wait for its peers is `seconds` in the block.

    A class attribute read by the strategy's constructor, set only for the construction.
    """
    from tensorflow.python.distribute import collective_all_reduce_strategy as cars

    extended = cars.CollectiveAllReduceExtended
    saved = extended._check_health_initial_timeout
    extended._check_health_initial_timeout = int(seconds or 0)
    try:
        yield
    finally:
        extended._check_health_initial_timeout = saved
