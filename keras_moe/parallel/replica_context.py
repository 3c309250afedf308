"""The `tf.distribute` replica context that routing statistics reduce over."""

from __future__ import annotations

from typing import TYPE_CHECKING

import keras

if TYPE_CHECKING:
    import tensorflow as tf


def replica_context() -> tf.distribute.ReplicaContext | None:
    """The `tf.distribute` replica context with > 1 replicas, or None.

    None on the JAX backend, in cross-replica context, and under the default
    (single-replica) strategy.

    Example:
    >>> replica_context() is None  # no strategy here
    True
    """
    if keras.backend.backend() != "tensorflow":
        return None
    import tensorflow as tf

    ctx = tf.distribute.get_replica_context()
    if ctx is None or ctx.num_replicas_in_sync <= 1:
        return None
    return ctx
