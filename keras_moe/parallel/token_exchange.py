"""Moving expert buffers between token-sharded and expert-sharded layouts (JAX mesh).

Under a mesh with an `expert` axis, the einsum dispatcher's buffers `[E, G, C, d]`
start laid out like the tokens (groups over `("data", "expert")`) and the experts
need them laid out by expert (experts over `expert`, groups over `data`). Left to
GSPMD, that resharding is often done by all-gathering the buffers over the expert
axis, which moves `expert`-size times the data. `to_experts` and `from_experts` do
it the GShard way, with one `jax.lax.all_to_all` each inside `jax.shard_map`: a
device sends each expert's slots to the device that holds the expert and gets back
the slots of its own experts from every device on its expert axis. A MoE layer's
forward pass then has exactly two token all-to-alls (and the backward two more,
their transposes).

The mode (`set_expert_exchange`):

- "auto" (default): all-to-all when the buffers allow it (see below), else the
  layout constraints alone (GSPMD chooses the collective).
- "all_to_all": always; a layout that does not allow it raises, saying why.
- "gspmd": the layout constraints alone (the behaviour before this module).

The all-to-all needs: the JAX backend with a mesh from
`keras_moe.parallel.sharding.configure_mesh`, an `expert` axis of size > 1 dividing `E`,
and a group count `G` that the rules split over the token axes with `expert`
last (the `DEFAULT_RULES` split it over `("data", "expert")`). Routing groups
are local to the batch's shards (`keras_moe.parallel.local_groups`), so the group count
divides over them whenever the mesh splits the batch; a batch too small to
split is one group, which cannot be split.

"auto" does not fall back in silence: on a mesh, each MoE layer's choice and
its reason are recorded when the layer is traced (`exchange_choices`; the
compile tool and the training job's start-up print them), and a fallback to
GSPMD on a mesh with an `expert` axis also warns.

Example (a no-op without a mesh):
>>> import numpy as np
>>> buffers = np.zeros((4, 2, 3, 8), "float32")  # [E, G, C, d]
>>> to_experts(buffers) is buffers
True
"""

from __future__ import annotations

import warnings
from typing import Any, Literal

import keras

from keras_moe import compat
from keras_moe.parallel import layouts, sharding
from keras_moe.tensor_types import Shape, Tensor

EXPERT_EXCHANGES = ("auto", "all_to_all", "gspmd")
ExpertExchange = Literal["auto", "all_to_all", "gspmd"]
# `(jax mesh, token group axes, expert group axes)` of the all-to-all.
ExchangeLayout = tuple[Any, tuple[str, ...], tuple[str, ...]]
_MODE: ExpertExchange = "auto"
# MoE layer path -> its exchange choice, recorded while layers are traced on a mesh.
_CHOICES: dict[str, dict[str, Any]] = {}

# Logical axes of an expert buffer [E, G, C, d] in each layout.
_TOKEN_LAYOUT = (None, "batch", None, "embed")
_EXPERT_LAYOUT = ("expert", "batch", None, "embed")


def set_expert_exchange(mode: ExpertExchange) -> None:
    """Chooses how expert buffers move between token and expert layouts.

    Args:
        mode: "auto", "all_to_all" or "gspmd" (see the module docstring).

    Example:
    >>> set_expert_exchange("gspmd"); get_expert_exchange()
    'gspmd'
    >>> set_expert_exchange("auto")
    """
    global _MODE
    if mode not in EXPERT_EXCHANGES:
        raise ValueError(f"`expert_exchange` must be one of {EXPERT_EXCHANGES}, got {mode!r}.")
    _MODE = mode


def get_expert_exchange() -> ExpertExchange:
    """The mode set by `set_expert_exchange` ("auto" by default)."""
    return _MODE


def _as_tuple(spec_entry):
    if spec_entry is None:
        return ()
    return (spec_entry,) if isinstance(spec_entry, str) else tuple(spec_entry)


def _as_spec_entry(axes):
    return None if not axes else (axes[0] if len(axes) == 1 else tuple(axes))


def exchange_plan(shape: Shape) -> tuple[ExchangeLayout | None, str | None]:
    """`(jax mesh, token group axes, expert group axes)` for buffers of `shape`,
    or `(None, reason)` when the all-to-all cannot (or is not to) be used."""
    if _MODE == "gspmd":
        return None, "expert_exchange is 'gspmd'"
    rules = sharding.get_logical_axis_rules()
    distribution = keras.distribution.distribution() if keras.backend.backend() == "jax" else None
    mesh = getattr(distribution, "device_mesh", None)
    if rules is None or mesh is None:
        return (
            None,
            "no mesh is configured (keras_moe.parallel.sharding.configure_mesh, JAX backend)",
        )
    mesh_shape = dict(zip(mesh.axis_names, mesh.shape, strict=False))
    experts = mesh_shape.get("expert", 1)
    if experts <= 1:
        return None, "the mesh has no 'expert' axis of size > 1"
    if shape[0] is None or shape[0] % experts:
        return None, f"{shape[0]} experts do not divide over the expert axis of size {experts}"
    token = layouts.logical_to_mesh_axes(_TOKEN_LAYOUT, rules, mesh_shape, shape)
    expert = layouts.logical_to_mesh_axes(_EXPERT_LAYOUT, rules, mesh_shape, shape)
    token_groups, expert_groups = _as_tuple(token[1]), _as_tuple(expert[1])
    if (
        token[0] is not None
        or token[2:] != (None, None)
        or expert[0] != "expert"
        or expert[2:] != (None, None)
        or not token_groups
        or token_groups[-1] != "expert"
        or token_groups[:-1] != expert_groups
    ):
        return None, (
            f"the rules lay the {shape[1]} groups out as {token[1]!r} among tokens "
            f"and {expert[1]!r} among experts; the all-to-all needs the token "
            "layout to be the expert layout's axes followed by 'expert' (the group "
            "count must divide over them; a batch the mesh cannot split is one "
            "group_size='batch' group)"
        )
    return (mesh.backend_mesh, token_groups, expert_groups), None


def exchange_choices() -> list[dict[str, Any]]:
    """How each MoE layer traced on a mesh moves its expert buffers, and why.

    Filled when layers are called (traced) under a mesh, from the last
    `clear_exchange_choices()`; empty without a mesh.

    Returns:
        A list, by layer path, of dicts: `layer` (its name-scope path),
        `exchange` ("all_to_all": two `jax.lax.all_to_all` per forward pass;
        "gspmd": left to the compiler's layout propagation), `reason`, and
        `buffer` (the expert buffers' shape `[E, G, C, d]`, or None).

    Example:
    >>> clear_exchange_choices(); exchange_choices()
    []
    """
    return [dict(layer=layer, **choice) for layer, choice in sorted(_CHOICES.items())]


def clear_exchange_choices() -> None:
    """Forgets the choices `exchange_choices` returns."""
    _CHOICES.clear()


def note_choice(
    exchange: Literal["all_to_all", "ragged_all_to_all", "gspmd"],
    reason: str,
    shape: Shape | None = None,
) -> None:
    """Records a MoE layer's exchange on an active mesh (`exchange_choices`).

    Called where the buffers move: `to_experts`, and the dispatchers that do
    not use it. Without a mesh it does nothing.

    Args:
        exchange: "all_to_all" or "gspmd".
        reason: why, in words.
        shape: the expert buffers' shape `[E, G, C, d]`, if there are any.
    """
    mesh_shape = sharding.active_mesh_shape()
    if mesh_shape is None:
        return
    layer = compat.current_layer_path() or "<no layer>"
    first = _CHOICES.get(layer, {}).get("reason") != reason
    _CHOICES[layer] = {
        "exchange": exchange,
        "reason": reason,
        "buffer": None if shape is None else list(shape),
    }
    if first and exchange == "gspmd" and _MODE == "auto" and mesh_shape.get("expert", 1) > 1:
        warnings.warn(
            f"MoE layer {layer}: expert_exchange='auto' falls back to GSPMD's "
            f"layout propagation ({reason}); it may all-gather tokens (keras-moe-compile "
            "counts the collectives).",
            RuntimeWarning,
            stacklevel=3,
        )


def _exchange(x, to_expert_layout):
    """The all-to-all move of `x`, or None to leave it to the layout constraints."""
    plan, reason = exchange_plan(tuple(x.shape))
    if plan is None:
        if _MODE == "all_to_all":
            raise ValueError(
                f"expert_exchange='all_to_all' cannot move expert buffers of "
                f"shape {tuple(x.shape)}: {reason}."
            )
        if to_expert_layout:
            note_choice("gspmd", reason, x.shape)
        return None
    import jax
    from jax.sharding import PartitionSpec as P

    mesh, token_groups, expert_groups = plan
    if to_expert_layout:
        note_choice(
            "all_to_all",
            (
                f"expert_exchange={_MODE!r}: the {x.shape[1]} routing groups are split over "
                f"{token_groups} with the tokens and over {expert_groups or 'no axis'} with the "
                "experts, so one all-to-all over 'expert' moves them each way"
            ),
            x.shape,
        )
    token_spec = P(None, _as_spec_entry(token_groups))
    expert_spec = P("expert", _as_spec_entry(expert_groups))
    if to_expert_layout:
        # Each device sends expert block j of its groups to peer j on the expert
        # axis and gets its own experts' slots from every peer, in peer order:
        # peers are the fastest-varying part of the token layout, so the groups
        # come back contiguous, as the expert layout has them.
        split_axis, concat_axis, in_spec, out_spec = 0, 1, token_spec, expert_spec
    else:
        split_axis, concat_axis, in_spec, out_spec = 1, 0, expert_spec, token_spec

    def move(block):
        return jax.lax.all_to_all(block, "expert", split_axis, concat_axis, tiled=True)

    return jax.shard_map(move, mesh=mesh, in_specs=in_spec, out_specs=out_spec, check_vma=True)(x)


def to_experts(buffers: Tensor) -> Tensor:
    """Expert buffers `[E, G, C, d]` in the token layout, laid out by expert.

    Args:
        buffers: `[E, G, C, d]`, groups laid out like the tokens.

    Returns:
        The same values, experts over the `expert` axis (a no-op without a mesh).
    """
    moved = _exchange(buffers, to_expert_layout=True)
    if moved is None:
        return sharding.with_logical_constraint(buffers, _EXPERT_LAYOUT)
    return moved


def from_experts(outputs: Tensor) -> Tensor:
    """The experts' outputs `[E, G, C, d]`, laid out by expert, back in the token layout.

    Args:
        outputs: `[E, G, C, d]`, experts over the `expert` axis.

    Returns:
        The same values, groups laid out like the tokens (unchanged when the
        all-to-all is not used: GSPMD then places them).
    """
    moved = _exchange(outputs, to_expert_layout=False)
    return outputs if moved is None else moved


def format_exchange_choices(choices: list[dict[str, Any]]) -> list[str]:
    """One line per MoE layer of `exchange_choices()`: exchange and why.

    Example:
    >>> format_exchange_choices([{"layer": "encoder/moe", "exchange": "all_to_all",
    ...                           "reason": "16 groups", "buffer": [16, 16, 20, 64]}])
    ['encoder/moe: all-to-all, buffers [16, 16, 20, 64] (16 groups)']
    """
    lines = []
    for choice in choices:
        exchange = {"all_to_all": "all-to-all", "gspmd": "GSPMD"}.get(
            choice["exchange"], choice["exchange"]
        )
        buffer = f", buffers {choice['buffer']}" if choice.get("buffer") else ""
        lines.append(f"{choice['layer']}: {exchange}{buffer} ({choice['reason']})")
    return lines
