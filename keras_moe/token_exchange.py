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
`keras_moe.sharding.configure_mesh`, an `expert` axis of size > 1 dividing `E`,
and a group count `G` that the rules split over the token axes with `expert`
last (the `DEFAULT_RULES` split it over `("data", "expert")`). With
`group_size="batch"` there is one group, which cannot be split: use "sequence"
or an integer group size for expert parallelism.

Example (a no-op without a mesh):
>>> import numpy as np
>>> buffers = np.zeros((4, 2, 3, 8), "float32")  # [E, G, C, d]
>>> to_experts(buffers) is buffers
True
"""

import keras

from keras_moe import layouts, sharding

EXPERT_EXCHANGES = ("auto", "all_to_all", "gspmd")
_MODE = "auto"

# Logical axes of an expert buffer [E, G, C, d] in each layout.
_TOKEN_LAYOUT = (None, "batch", None, "embed")
_EXPERT_LAYOUT = ("expert", "batch", None, "embed")


def set_expert_exchange(mode):
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


def get_expert_exchange():
    """The mode set by `set_expert_exchange` ("auto" by default)."""
    return _MODE


def _as_tuple(spec_entry):
    if spec_entry is None:
        return ()
    return (spec_entry,) if isinstance(spec_entry, str) else tuple(spec_entry)


def _as_spec_entry(axes):
    return None if not axes else (axes[0] if len(axes) == 1 else tuple(axes))


def exchange_plan(shape):
    """`(jax mesh, token group axes, expert group axes)` for buffers of `shape`,
    or `(None, reason)` when the all-to-all cannot (or is not to) be used."""
    if _MODE == "gspmd":
        return None, "expert_exchange is 'gspmd'"
    rules = sharding.get_logical_axis_rules()
    distribution = keras.distribution.distribution() if keras.backend.backend() == "jax" else None
    mesh = getattr(distribution, "device_mesh", None)
    if rules is None or mesh is None:
        return None, "no mesh is configured (keras_moe.sharding.configure_mesh, JAX backend)"
    mesh_shape = dict(zip(mesh.axis_names, mesh.shape))
    experts = mesh_shape.get("expert", 1)
    if experts <= 1:
        return None, "the mesh has no 'expert' axis of size > 1"
    if shape[0] is None or shape[0] % experts:
        return None, f"{shape[0]} experts do not divide over the expert axis of size {experts}"
    token = layouts.logical_to_mesh_axes(_TOKEN_LAYOUT, rules, mesh_shape, shape)
    expert = layouts.logical_to_mesh_axes(_EXPERT_LAYOUT, rules, mesh_shape, shape)
    token_groups, expert_groups = _as_tuple(token[1]), _as_tuple(expert[1])
    if (token[0] is not None or token[2:] != (None, None) or expert[0] != "expert"
            or expert[2:] != (None, None) or not token_groups or token_groups[-1] != "expert"
            or token_groups[:-1] != expert_groups):
        return None, (f"the rules lay the {shape[1]} groups out as {token[1]!r} among tokens "
                      f"and {expert[1]!r} among experts; the all-to-all needs the token "
                      "layout to be the expert layout's axes followed by 'expert' (the group "
                      "count must divide over them; group_size='batch' gives one group)")
    return (mesh.backend_mesh, token_groups, expert_groups), None


def _exchange(x, to_expert_layout):
    """The all-to-all move of `x`, or None to leave it to the layout constraints."""
    plan, reason = exchange_plan(tuple(x.shape))
    if plan is None:
        if _MODE == "all_to_all":
            raise ValueError(f"expert_exchange='all_to_all' cannot move expert buffers of "
                             f"shape {tuple(x.shape)}: {reason}.")
        return None
    import jax
    from jax.sharding import PartitionSpec as P

    mesh, token_groups, expert_groups = plan
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

    return jax.shard_map(move, mesh=mesh, in_specs=in_spec, out_specs=out_spec,
                         check_vma=True)(x)


def to_experts(buffers):
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


def from_experts(outputs):
    """The experts' outputs `[E, G, C, d]`, laid out by expert, back in the token layout.

    Args:
        outputs: `[E, G, C, d]`, experts over the `expert` axis.

    Returns:
        The same values, groups laid out like the tokens (unchanged when the
        all-to-all is not used: GSPMD then places them).
    """
    moved = _exchange(outputs, to_expert_layout=False)
    return outputs if moved is None else moved
