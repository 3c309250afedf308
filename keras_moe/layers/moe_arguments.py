"""The checks of a MoE layer's arguments that read more than one of them: the
router's kind against `balance_loss` and `causal`, and the router's and the
experts' sizes. `MoeLayer.check_arguments` runs them after the rules of
`keras_moe.arguments`, on layers or on their configs alike, building nothing.

Example:
>>> import keras_moe
>>> check_combinations({"router": keras_moe.ExpertChoiceRouter(4), "causal": True})
Traceback (most recent call last):
...
ValueError: `router` ExpertChoiceRouter looks at every token of a group and cannot be used in a causal layer (causal=True); use a token-choice router such as SwitchRouter or Top2Router.
"""  # noqa: E501 - a verbatim output line

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import keras

from keras_moe.arguments import check_dropless_buffer_factor
from keras_moe.routing import Router

_MISSING = object()


def part_argument(arguments: Mapping[str, Any], part: str, name: str, default: Any = None) -> Any:
    """Argument `name` of the `part` ("router", "experts") given in `arguments`,
    as a layer or as its config; else `arguments[name]` (a layer that makes its
    own router from plain arguments); else `default`."""
    value = arguments.get(part)
    if isinstance(value, keras.layers.Layer):
        return getattr(value, name, default)
    if isinstance(value, Mapping) and isinstance(value.get("config"), Mapping):
        return value["config"].get(name, default)
    return arguments.get(name, default)


def router_class_of(
    arguments: Mapping[str, Any], default: type[Router] | None = None
) -> type[Router] | None:
    """The class of the router given in `arguments` (a layer or its config), else `default`."""
    router = arguments.get("router")
    if isinstance(router, Router):
        return type(router)
    if isinstance(router, Mapping):
        found = keras.saving.get_registered_object(
            router.get("registered_name") or router.get("class_name")
        )
        return found if isinstance(found, type) and issubclass(found, Router) else default
    return default


def check_combinations(
    arguments: Mapping[str, Any], router_class: type[Router] | None = None
) -> None:
    """Raises ValueError when arguments that are each allowed do not go together.

    Args:
        arguments: a MoE layer's arguments (the others take their defaults);
            `router` and `experts` as layers or as their configs.
        router_class: the router class of a layer that makes its own router.
    """
    check_dropless_buffer_factor(
        arguments.get("dispatch", "auto"), arguments.get("dropless_buffer_factor")
    )
    router_class = router_class_of(arguments, router_class)
    balance_loss = arguments.get("balance_loss", "group")
    if (
        balance_loss != "group"
        and router_class is not None
        and not router_class.picks_experts_per_token
    ):
        raise ValueError(
            f"`balance_loss={balance_loss!r}` needs a token-choice router; "
            f"{router_class.__name__} has no balance loss."
        )
    routed = part_argument(arguments, "router", "num_experts", _MISSING)
    computed = part_argument(arguments, "experts", "num_experts", _MISSING)
    if _MISSING not in (routed, computed) and routed != computed:
        raise ValueError(
            f"`router.num_experts` ({routed}) must equal `experts.num_experts` ({computed})."
        )
    if not arguments.get("causal", False):
        return
    if router_class is not None and not router_class.is_causal_safe:
        raise ValueError(
            f"`router` {router_class.__name__} looks at every token of a group and "
            "cannot be used in a causal layer (causal=True); use a token-choice "
            "router such as SwitchRouter or Top2Router."
        )
    if part_argument(arguments, "router", "batch_prioritized_routing", False):
        raise ValueError(
            "`batch_prioritized_routing=True` fills capacity by router confidence over "
            "the whole group, so later tokens decide which earlier ones are dropped; it "
            "cannot be used in a causal layer (causal=True)."
        )
