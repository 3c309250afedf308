"""Every public function and method of the core layer modules has type hints.

The core modules are `keras_moe/*.py` and the core's wings (`routing/`, `layers/`,
`dispatch/`, `parallel/`), and the training
job's public API (`TRAINING_API`: its config, collaborators and run). For each public function a
module defines (not one it imports), and each public method (and `__init__`,
`__call__`) of the classes it defines, inherited ones from keras_moe base
classes included: every parameter but `self`/`cls`/`*args`/`**kwargs` has an
annotation, and so has the return value (`__init__` excepted).
"""

import importlib
import inspect
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
CORE_FOLDERS = (
    "keras_moe",
    "keras_moe/routing",
    "keras_moe/layers",
    "keras_moe/dispatch",
    "keras_moe/parallel",
)
CHECKED_DUNDERS = ("__init__", "__call__")
# The training job's public API: its config, collaborators and run.
TRAINING_API = tuple(
    f"keras_moe.training.{name}"
    for name in (
        "train_config",
        "trainer",
        "checkpoint.checkpoint_config",
        "placement.strategy_placement",
        "placement.mesh_placement",
        "run.training_run",
        "run.dataset_config",
        "run.dtype_policy",
        "run.model_dir",
        "run.compiled_model",
        "run.summary",
        "checkpoint.upcycle_checkpoint",
    )
)


def core_modules():
    names = []
    for folder in CORE_FOLDERS:
        for path in sorted((ROOT / folder).glob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            names.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return names


def _function_of(member):
    if isinstance(member, (staticmethod, classmethod)):
        member = member.__func__
    if isinstance(member, property):
        member = member.fget
    return member if inspect.isfunction(member) else None


def missing_annotations(qualname, function, needs_return=True):
    """`["<qualname>: parameter x", "<qualname>: return"]` for what `function` leaves bare."""
    signature = inspect.signature(function)
    missing = []
    for name, parameter in signature.parameters.items():
        if name in ("self", "cls") or parameter.kind in (
            parameter.VAR_POSITIONAL,
            parameter.VAR_KEYWORD,
        ):
            continue
        if parameter.annotation is parameter.empty:
            missing.append(f"{qualname}: parameter {name}")
    if needs_return and signature.return_annotation is signature.empty:
        missing.append(f"{qualname}: return")
    return missing


def public_callables(module):
    """`(qualname, function, needs_return)` of the public API `module` defines."""
    for name, obj in sorted(vars(module).items()):
        if name.startswith("_") or getattr(obj, "__module__", None) != module.__name__:
            continue
        if inspect.isfunction(obj):
            yield f"{module.__name__}.{name}", obj, True
        elif inspect.isclass(obj):
            seen = set()
            for cls in obj.__mro__:
                if not cls.__module__.startswith("keras_moe"):
                    continue
                for attr, member in vars(cls).items():
                    if attr in seen or (attr.startswith("_") and attr not in CHECKED_DUNDERS):
                        continue
                    seen.add(attr)
                    function = _function_of(member)
                    if function is not None:
                        yield (
                            f"{module.__name__}.{name}.{attr}"
                            + ("" if cls is obj else f" (from {cls.__name__})"),
                            function,
                            attr != "__init__",
                        )


def test_the_checker_catches_missing_hints():
    def bare(x, y: int = 1, *args, **kwargs):
        return x

    def hinted(x: int, *args: int, **kwargs: str) -> int:
        return x

    assert missing_annotations("bare", bare) == ["bare: parameter x", "bare: return"]
    assert missing_annotations("hinted", hinted) == []
    assert missing_annotations("init", bare, needs_return=False) == ["init: parameter x"]


def test_the_core_modules_are_found():
    names = core_modules()
    assert {
        "keras_moe.layers.moe",
        "keras_moe.dispatch",
        "keras_moe.routing",
        "keras_moe.routing.token_choice",
    } <= set(names)
    assert not any(n.startswith(("keras_moe.models", "keras_moe.training")) for n in names)


@pytest.mark.parametrize("name", core_modules() + list(TRAINING_API))
def test_public_api_has_type_hints(name):
    module = importlib.import_module(name)
    missing = [
        entry
        for qualname, function, needs_return in public_callables(module)
        for entry in missing_annotations(qualname, function, needs_return)
    ]
    assert not missing, "missing type hints:\n" + "\n".join(missing)
