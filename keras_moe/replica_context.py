"""The `tf.distribute` replica context that routing statistics reduce over."""

import keras


def replica_context():
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
