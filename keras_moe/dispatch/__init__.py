"""Dispatch and combine: move tokens to expert buffers and expert outputs back.

The three dispatchers consume the same `RoutingInstructions`; einsum and
gather give the same numbers, dropless matches them where their capacity
drops nothing. They differ in how they move data:

- `EinsumDispatcher` builds one-hot dispatch/combine tensors `[G, S, E, C]`
  and contracts them with einsums (GShard's formulation). Shapes are static,
  which is what TPUs want, and under a JAX mesh the buffers move between
  the token and expert layouts by two all-to-alls (`keras_moe.parallel.token_exchange`).
  Cost grows with `S * E * C`.
- `GatherDispatcher` computes, for every expert slot, which token fills it,
  then gathers tokens into slots and scatter-adds slot outputs back into
  tokens. Memory and time are O(tokens * d), which is what CPUs and GPUs want.
- `DroplessDispatcher` has no capacity and drops nothing: the token-expert
  assignments are sorted by expert and each expert multiplies exactly its
  tokens (`grouped_matmul`), as MegaBlocks does on GPUs. Group sizes depend
  on the routing: TensorFlow runs it with dynamic shapes (CPU/GPU, not XLA or
  TPU); JAX with static shapes and a grouped-matmul kernel (tiles of rows as one
  batched matmul on CPU, `ragged_dot` on GPU, the Pallas megablox kernel on
  TPU; docs/dropless.md).

Expert buffers are laid out `[E, G, C, d]` (experts first), so the experts'
batched matmul needs no transpose and the expert axis can be sharded.
`Dispatcher.apply` runs the whole path (dispatch, experts, combine).

Each dispatcher has its own module (`dispatch_einsum`, `dispatch_gather`,
`dispatch_dropless`, the interface in `dispatch_base`); this one picks one by
name (`get_dispatcher`) and re-exports them.
"""

from __future__ import annotations

import keras

from keras_moe.arguments import (
    DISPATCH_MODES,
    DispatchMode,
    check_dropless_buffer_factor,
    check_values,
)
from keras_moe.dispatch.base import Dispatcher
from keras_moe.dispatch.dropless import DroplessDispatcher
from keras_moe.dispatch.einsum import EinsumDispatcher, EinsumPlan
from keras_moe.dispatch.gather import GatherDispatcher, GatherPlan
from keras_moe.parallel import sharding

__all__ = [
    "DISPATCH_MODES",
    "Dispatcher",
    "DroplessDispatcher",
    "EinsumDispatcher",
    "EinsumPlan",
    "GatherDispatcher",
    "GatherPlan",
    "get_dispatcher",
    "resolve_dispatch",
]


def resolve_dispatch(mode: DispatchMode, platform: str) -> DispatchMode:
    """The dispatch "auto" stands for on `platform` ("tpu", "gpu" or "cpu"): einsum on
    TPU (static shapes), gather elsewhere: a capacity dispatch, as Switch and GShard
    route; dropless is chosen by name. Other modes are returned as they are.

    Example:
    >>> resolve_dispatch("auto", "tpu"), resolve_dispatch("auto", "cpu")
    ('einsum', 'gather')
    """
    if mode == "auto":
        return "einsum" if platform == "tpu" else "gather"
    return mode


def get_dispatcher(mode: DispatchMode, dropless_buffer_factor: float | None = None) -> Dispatcher:
    """Returns the dispatcher for `mode` ("einsum", "gather", "dropless" or "auto").

    "auto" picks einsum on TPU and gather everywhere else (`resolve_dispatch`);
    "dropless" is refused on TPU with the TensorFlow backend (its grouped
    matmul needs dynamic shapes there); on JAX it runs on TPU with the megablox
    kernel and on a CPU with the tiled one (`keras_moe.dispatch.grouped_matmul`).

    `dropless_buffer_factor`: the dropless dispatcher's receive buffer with
    experts split over a mesh (`keras_moe.dispatch.dropless_exchange`); only with
    mode "dropless".

    Example:
    >>> get_dispatcher("gather").name
    'gather'
    """
    check_values({"dispatch": mode, "dropless_buffer_factor": dropless_buffer_factor})
    check_dropless_buffer_factor(mode, dropless_buffer_factor)
    platform = sharding.accelerator_platform()
    mode = resolve_dispatch(mode, platform)
    if mode == "dropless":
        if platform == "tpu" and keras.backend.backend() != "jax":
            raise ValueError(
                "dispatch='dropless' on TPU needs the JAX backend (its grouped matmul there "
                "is the megablox kernel; TensorFlow's needs shapes that depend on the "
                "routing, which TPUs do not compile): set KERAS_BACKEND=jax, or use "
                "dispatch='einsum' (or 'auto') with a capacity factor."
            )
        return DroplessDispatcher(dropless_buffer_factor)
    return EinsumDispatcher() if mode == "einsum" else GatherDispatcher()
