"""`route_each_sequence()`: a per-thread default for MoE layers' `independent_routing`."""

import contextlib
import threading
from collections.abc import Iterator

# How many `route_each_sequence` scopes this thread has open: per thread, so a
# scope opened by one thread (a server decoding) never changes how another
# thread (a training job) traces its layers.
_scopes = threading.local()


@contextlib.contextmanager
def route_each_sequence() -> Iterator[None]:
    """A scope in which MoE layers called from this thread route each sequence apart.

    Inside it, a layer called without `independent_routing` behaves as with
    `independent_routing=True` (see `MoeLayer`): no routing group holds tokens
    of two sequences, so a sequence's outputs do not depend on the rest of
    the batch. It is read when a layer is called (or traced: a function
    traced inside the scope keeps the mode), and only in the thread that
    opened it. Decoding and serving do not need it: they pass
    `independent_routing=True` to the model's `encode`/`decode` themselves.

    Example:
    >>> import numpy as np
    >>> import keras_moe
    >>> layer = keras_moe.SwitchFeedForward(num_experts=4, d_ff=16, eval_capacity_factor=0.5,
    ...                                     min_expert_capacity=1)
    >>> x = np.random.default_rng(0).normal(size=(3, 8, 8)).astype("float32")
    >>> with route_each_sequence():
    ...     alone = layer(x[:1])
    ...     together = layer(x)[:1]
    >>> bool(np.allclose(alone, together, atol=1e-6))
    True
    """
    _scopes.open = getattr(_scopes, "open", 0) + 1
    try:
        yield
    finally:
        _scopes.open -= 1


def routing_each_sequence() -> bool:
    """Whether this thread has a `route_each_sequence()` scope open."""
    return getattr(_scopes, "open", 0) > 0
