"""Bindings of the model's gin configurables that nothing read.

gin takes a binding of any registered configurable, called or not: a binding
for `SwitchFeedForward` on a GShard model, for `encoder/SwitchFeedForward`
when no `T5Config.encoder_sparse_ffn = @encoder/SwitchFeedForward` calls it in
that scope, or for a misspelt scope (`encodr/`) configures nothing, silently.
Once the model is made, every configurable of its architecture
(`keras_moe.gin_config.model_configurables.MODEL_SELECTORS`: `T5Config` and the MoE
layers, routers and experts) that it uses has been called, so a binding none
of those calls read is an error naming it and the model's sparse layer.
`parse_gin` checks after making the `T5Config`, a training run after building
its model. Configurables of other commands (evaluation, export, distillation,
the compile tool, decoding, seqio preprocessors) are not checked: a run file
binds them for a later command.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import TYPE_CHECKING

from keras_moe import compat
from keras_moe.gin_config.errors import GinConfigError

if TYPE_CHECKING:
    from keras_moe.models.config import T5Config

SIDES = ("encoder", "decoder")


def _scope_parts(scope):
    return scope.split("/") if scope else []


def _name(scope, selector):
    short = selector.rsplit(".", 1)[-1]
    return f"{scope}/{short}" if scope else short


def unread_bindings(selectors: Collection[str]) -> list[tuple[str, str, list[str]]]:
    """The bound parameters of the configurables `selectors` that no call read.

    A binding in scope `a` is read by a call in scope `a` or `a/b` (gin's scope
    inheritance); an unscoped binding by any call.

    Args:
        selectors: gin's full names of the configurables to check
            (e.g. "keras_moe.SwitchFeedForward").

    Returns:
        `[(scope, selector, [parameter, ...]), ...]`, sorted.

    Example:
    >>> from keras_moe.gin_config import parse_gin
    >>> from keras_moe.gin_config.model_configurables import MODEL_SELECTORS
    >>> _ = parse_gin("switch_tiny.gin", check_unread=False,
    ...               bindings="encodr/SwitchFeedForward.num_experts = 4")
    >>> unread_bindings(MODEL_SELECTORS)
    [('encodr', 'keras_moe.SwitchFeedForward', ['num_experts'])]
    """
    called = compat.gin_called_configurables()
    out = []
    for (scope, selector), params in sorted(compat.gin_bound_parameters().items()):
        if selector not in selectors:
            continue
        parts = _scope_parts(scope)
        if not any(
            sel == selector and _scope_parts(where)[: len(parts)] == parts for where, sel in called
        ):
            out.append((scope, selector, list(params)))
    return out


def describe_sparse_layers(config: T5Config) -> str:
    """`"the model's sparse layer is X"` for a `T5Config` (each stack's when they differ)."""
    sides = {
        side: config.required_sparse_ffn_spec(side)["class_name"].split(">")[-1]
        for side in SIDES
        if getattr(config, f"resolved_{side}_sparse_layers")()
    }
    if not sides:
        return "the model has no sparse layer (a dense model)"
    if len(set(sides.values())) == 1:
        return f"the model's sparse layer is {next(iter(sides.values()))}"
    return "the model's sparse layers are " + " and ".join(
        f"{name} ({side})" for side, name in sides.items()
    )


def refuse_unread_model_bindings(config: T5Config | None = None) -> None:
    """Raises `GinConfigError` if a binding of the model's configurables was not read.

    Call it once the model (its `T5Config`) is made.

    Args:
        config: the model's `T5Config`, named in the message; None: the gin
            calls of the sparse layers are named instead.

    Example:
    >>> import gin
    >>> from keras_moe.gin_config import parse_gin
    >>> config = parse_gin("gshard_top2_base.gin", check_unread=False,
    ...                    bindings="SwitchFeedForward.num_experts = 16")
    >>> refuse_unread_model_bindings(config)
    Traceback (most recent call last):
    ...
    keras_moe.gin_config.errors.GinConfigError: `SwitchFeedForward.num_experts` was bound but the
    model's sparse layer is GShardFeedForward; nothing read it...
    >>> gin.clear_config()
    """

    from keras_moe.gin_config.model_configurables import MODEL_SELECTORS

    unread = unread_bindings(MODEL_SELECTORS)
    if not unread:
        return
    names = [
        f"`{_name(scope, selector)}.{param}`"
        for scope, selector, params in unread
        for param in params
    ]
    called = sorted(
        {
            _name(where, selector)
            for where, selector in compat.gin_called_configurables()
            if selector in MODEL_SELECTORS and selector != MODEL_SELECTORS[0]
        }
    )
    if config is not None:
        layer = describe_sparse_layers(config)
    elif called:
        layer = f"the model's sparse layer is {' and '.join(called)}"
    else:
        layer = "the model has no sparse layer"
    several = len(names) > 1
    message = (
        f"{', '.join(names)} {'were' if several else 'was'} bound but {layer}; "
        f"nothing read {'them' if several else 'it'}."
    )
    if called:
        message += f" gin called {', '.join(called)}."
    scoped = next((_name(scope, selector) for scope, selector, _ in unread if scope), None)
    if scoped:
        message += (
            f" A binding of `{scoped}` is read only where a binding refers to "
            f"`@{scoped}`, e.g. `T5Config.encoder_sparse_ffn = @{scoped}`."
        )
    raise GinConfigError(
        message + " Remove the binding, or bind the model to the layer it configures."
    )
