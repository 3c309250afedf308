"""The allowed values of the MoE layers' arguments, and the one table that checks them.

An argument's name means the same thing in every layer that takes it (a
router's `jitter_noise`, a `SwitchFeedForward`'s `jitter_noise`), so one rule
per name serves every constructor, and `MoeLayer.check_arguments` applies
the same rules to a spec's arguments without building a layer.

Example:
>>> check_values({"dispatch": "gather", "k": 2, "unknown_name": object()})
>>> check_values({"jitter_noise": 1.0})
Traceback (most recent call last):
...
ValueError: `jitter_noise` must be a number in [0, 1), got 1.0.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Literal, get_args

from keras_moe.validation import is_int, is_number

Activation = Literal["relu", "gelu", "gated-gelu", "gated-relu", "gated-silu", "clamped-swiglu"]
BalanceLoss = Literal["group", "sequence", "global"]
DispatchMode = Literal["auto", "einsum", "gather", "dropless"]
NormalizeGates = Literal["before_capacity", "after_capacity"]
RouterDtype = Literal["float32", "bfloat16", "mixed_bfloat16"]
ScoreFunction = Literal["softmax", "sigmoid"]
SecondExpertPolicy = Literal["all", "random", "threshold"]
EvalSecondExpertPolicy = Literal["all", "threshold"]

ACTIVATIONS: tuple[str, ...] = get_args(Activation)
BALANCE_LOSSES: tuple[str, ...] = get_args(BalanceLoss)
DISPATCH_MODES: tuple[str, ...] = get_args(DispatchMode)
NORMALIZE_GATES: tuple[str, ...] = get_args(NormalizeGates)
ROUTER_DTYPES: tuple[str, ...] = get_args(RouterDtype)
SCORE_FUNCTIONS: tuple[str, ...] = get_args(ScoreFunction)
SECOND_EXPERT_POLICIES: tuple[str, ...] = get_args(SecondExpertPolicy)
EVAL_SECOND_EXPERT_POLICIES: tuple[str, ...] = get_args(EvalSecondExpertPolicy)
GROUPINGS = ("batch", "sequence")

# A rule returns what is wrong with a value ("must be ...") or None.
Rule = Callable[[Any], str | None]


def one_of(allowed: tuple[str, ...]) -> Rule:
    return lambda value: None if value in allowed else f"must be one of {allowed}"


def integer(low: int) -> Rule:
    return lambda value: None if is_int(value) and value >= low else f"must be an integer >= {low}"


def number(low: float, high: float | None = None, low_open: bool = False) -> Rule:
    """A number above `low` (strictly if `low_open`), below `high` (strictly)."""
    if high is not None:
        bounds = f"in {'(' if low_open else '['}{low:g}, {high:g})"
    else:
        bounds = f"{'>' if low_open else '>='} {low:g}"

    def rule(value: Any) -> str | None:
        ok = (
            is_number(value)
            and (value > low if low_open else value >= low)
            and (high is None or value < high)
        )
        return None if ok else f"must be a number {bounds}"

    return rule


def or_none(rule: Rule) -> Rule:
    def none_or(value: Any) -> str | None:
        problem = None if value is None else rule(value)
        return None if problem is None else f"{problem} or None"

    return none_or


def _group_size(value: Any) -> str | None:
    if value is None or value in GROUPINGS or (is_int(value) and value >= 1):
        return None
    return f"must be one of {GROUPINGS}, None or an integer >= 1"


def _threshold(value: Any) -> str | None:
    ok = value is None or (is_number(value) and 0.0 < value <= 1.0)
    return None if ok else "must be a number in (0, 1] or None"


_RATE = number(0.0, 1.0)
_POSITIVE = number(0.0, low_open=True)
_FACTOR = number(0.0)

RULES: dict[str, Rule] = {
    # MoeLayer
    "group_size": _group_size,
    "train_capacity_factor": _POSITIVE,
    "eval_capacity_factor": _POSITIVE,
    "min_expert_capacity": integer(0),
    "dispatch": one_of(DISPATCH_MODES),
    "dropless_buffer_factor": or_none(_POSITIVE),
    "aux_loss_factor": _FACTOR,
    "z_loss_factor": _FACTOR,
    "balance_loss": one_of(BALANCE_LOSSES),
    # the ready-made layers' own
    "router_dtype": one_of(ROUTER_DTYPES),
    "expert_dropout_rate": _RATE,
    "router_init_scale": or_none(_POSITIVE),
    "shared_d_ff": or_none(integer(1)),
    # routers
    "num_experts": integer(1),
    "jitter_noise": _RATE,
    "score_function": one_of(SCORE_FUNCTIONS),
    "routed_scaling_factor": _POSITIVE,
    "k": integer(1),
    "n_group": integer(1),
    "topk_group": or_none(integer(1)),
    "bias_update_rate": _FACTOR,
    "second_expert_policy": one_of(SECOND_EXPERT_POLICIES),
    "eval_second_expert_policy": one_of(EVAL_SECOND_EXPERT_POLICIES),
    "second_expert_threshold": _threshold,
    "normalize_gates": one_of(NORMALIZE_GATES),
    # experts and shared experts
    "d_ff": integer(1),
    "activation": one_of(ACTIVATIONS),
    "dropout_rate": _RATE,
    "init_scale": _POSITIVE,
    "swiglu_alpha": _POSITIVE,
    "swiglu_limit": _POSITIVE,
}


def check_values(arguments: Mapping[str, Any]) -> None:
    """Raises ValueError naming the first argument of `arguments` whose value its
    rule refuses; names without a rule are left alone.

    Args:
        arguments: argument names and the values given for them.
    """
    for name, value in arguments.items():
        rule = RULES.get(name)
        problem = rule(value) if rule else None
        if problem:
            raise ValueError(f"`{name}` {problem}, got {value!r}.")


def check_dropless_buffer_factor(dispatch: Any, dropless_buffer_factor: Any) -> None:
    """Raises ValueError when a dropless receive buffer is sized for another dispatch."""
    if dropless_buffer_factor is not None and dispatch != "dropless":
        raise ValueError(
            "`dropless_buffer_factor` sizes the dropless dispatcher's receive "
            f"buffer; it needs dispatch='dropless', got dispatch={dispatch!r}."
        )
