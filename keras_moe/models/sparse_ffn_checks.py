"""Checks of a sparse FFN's plain arguments by value, so `T5Config` refuses a bad one
without building a layer; each says what the layer's own constructor says."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from keras_moe.dispatch import DISPATCH_MODES
from keras_moe.feedforward import ROUTER_DTYPES
from keras_moe.feedforward_mixin import ACTIVATIONS
from keras_moe.moe import GROUPINGS
from keras_moe.router_losses import BALANCE_LOSSES
from keras_moe.routing.base import SCORE_FUNCTIONS
from keras_moe.routing.token_choice import NORMALIZE_GATES, SECOND_EXPERT_POLICIES
from keras_moe.validation import is_int, is_number


def _one_of(allowed: tuple) -> Callable[[str, Any], str | None]:
    return lambda name, v: None if v in allowed else f"must be one of {allowed}"


def _number(low: float, high: float | None = None, low_open: bool = False):
    def check(name: str, v: Any) -> str | None:
        ok = is_number(v) and (v > low if low_open else v >= low) and (high is None or v < high)
        if ok:
            return None
        bound = f"> {low}" if low_open else f">= {low}"
        return f"must be a number {bound}" + ("" if high is None else f" and < {high}")

    return check


def _int(low: int) -> Callable[[str, Any], str | None]:
    return lambda name, v: None if is_int(v) and v >= low else f"must be an integer >= {low}"


def _group_size(name: str, v: Any) -> str | None:
    if v is None or v in GROUPINGS or (is_int(v) and v >= 1):
        return None
    return f"must be one of {GROUPINGS}, None or an integer >= 1"


CHECKS: dict[str, Callable[[str, Any], str | None]] = {
    "dispatch": _one_of(DISPATCH_MODES),
    "router_dtype": _one_of(ROUTER_DTYPES),
    "activation": _one_of(ACTIVATIONS),
    "balance_loss": _one_of(BALANCE_LOSSES),
    "score_function": _one_of(SCORE_FUNCTIONS),
    "second_expert_policy": _one_of(SECOND_EXPERT_POLICIES),
    "normalize_gates": _one_of(NORMALIZE_GATES),
    "group_size": _group_size,
    "train_capacity_factor": _number(0, low_open=True),
    "eval_capacity_factor": _number(0, low_open=True),
    "min_expert_capacity": _int(0),
    "aux_loss_factor": _number(0),
    "z_loss_factor": _number(0),
    "jitter_noise": _number(0, 1),
    "dropout_rate": _number(0, 1),
    "expert_dropout_rate": _number(0, 1),
    "init_scale": _number(0, low_open=True),
    "routed_scaling_factor": _number(0, low_open=True),
    "k": _int(1),
}


def check_arguments(layer_name: str, arguments: dict[str, Any]) -> None:
    """Raises ValueError naming the first argument of `arguments` with a bad value.

    Args:
        layer_name: the layer class's name, for the message.
        arguments: the spec's arguments (names `CHECKS` does not know are left
            to the constructor).

    Example:
    >>> check_arguments("SwitchFeedForward", {"dispatch": "gather", "k": 1})
    >>> check_arguments("SwitchFeedForward", {"dispatch": "sorted"})
    Traceback (most recent call last):
    ...
    ValueError: `sparse_ffn`: `dispatch` must be one of ('auto', 'einsum', 'gather', 'dropless') for SwitchFeedForward, got 'sorted'.
    """  # noqa: E501 - verbatim output lines
    for name, value in arguments.items():
        check = CHECKS.get(name)
        problem = check(name, value) if check else None
        if problem:
            raise ValueError(f"`sparse_ffn`: `{name}` {problem} for {layer_name}, got {value!r}.")
