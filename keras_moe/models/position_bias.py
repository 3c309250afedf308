"""T5 relative position bias: bucketed relative distances -> a learned bias per head."""

import math

import keras
from keras import ops


def relative_position_bucket(
    relative_position, bidirectional=True, num_buckets=32, max_distance=128
):
    """Maps `memory_position - query_position` to a bucket id (Mesh TF / T5).

    Half of the buckets hold exact small distances, the rest grow
    logarithmically up to `max_distance`; beyond it everything shares the last
    bucket. Bidirectional: positive and negative distances get separate halves.
    Causal: positive distances (the future) all map to bucket 0.

    Args:
        relative_position: int tensor.
        bidirectional: whether attention looks both ways.
        num_buckets: number of buckets.
        max_distance: distance of the last bucket.

    Returns:
        int32 tensor of the same shape, values in [0, num_buckets).

    Example:
    >>> import numpy as np
    >>> relative_position_bucket(np.array([-3, 0, 3]), bidirectional=True).numpy().tolist()
    [3, 0, 19]
    >>> relative_position_bucket(np.array([-3, 0, 3]), bidirectional=False).numpy().tolist()
    [3, 0, 0]
    """
    n = -ops.cast(relative_position, "int32")
    ret = ops.zeros_like(n)
    if bidirectional:
        num_buckets //= 2
        ret = ret + ops.cast(n < 0, "int32") * num_buckets
        n = ops.abs(n)
    else:
        n = ops.maximum(n, 0)
    max_exact = num_buckets // 2
    is_small = n < max_exact
    n_float = ops.cast(ops.maximum(n, 1), "float32")
    large = ops.log(n_float / max_exact) / math.log(max_distance / max_exact)
    large = max_exact + ops.cast(large * (num_buckets - max_exact), "int32")
    large = ops.minimum(large, num_buckets - 1)
    return ret + ops.where(is_small, n, large)


@keras.saving.register_keras_serializable(package="keras_moe")
class RelativePositionBias(keras.layers.Layer):
    """Learned bias `[num_buckets, num_heads]` looked up by relative position bucket.

    T5 computes it once per stack (in its first layer) and shares it across
    layers; the model does the same by owning one of these per stack.

    Args:
        num_heads: attention heads.
        num_buckets: relative position buckets.
        max_distance: distance of the last bucket.
        bidirectional: True for the encoder, False for the decoder self-attention.

    Example:
    >>> import numpy as np
    >>> bias = RelativePositionBias(num_heads=4)
    >>> b = bias(np.arange(5)[None], np.arange(5)[None])  # query, memory positions
    >>> tuple(b.shape)  # [1, heads, query, memory]
    (1, 4, 5, 5)
    """

    def __init__(self, num_heads, num_buckets=32, max_distance=128, bidirectional=True, **kwargs):
        super().__init__(**kwargs)
        self.num_heads = num_heads
        self.num_buckets = num_buckets
        self.max_distance = max_distance
        self.bidirectional = bool(bidirectional)

    def build(self, input_shape=None):
        self.embeddings = self.add_weight(
            name="embeddings",
            shape=(self.num_buckets, self.num_heads),
            initializer=keras.initializers.RandomNormal(stddev=1.0),
        )
        self.built = True

    def call(self, query_positions, key_positions):
        """Positions `[B or 1, Lq]`, `[B or 1, Lk]` -> bias `[B or 1, H, Lq, Lk]` (float32)."""
        relative = (
            ops.cast(key_positions, "int32")[:, None, :]
            - ops.cast(query_positions, "int32")[:, :, None]
        )
        buckets = relative_position_bucket(
            relative, self.bidirectional, self.num_buckets, self.max_distance
        )
        values = ops.take(ops.cast(self.embeddings, "float32"), buckets, axis=0)  # [B, q, k, H]
        return ops.transpose(values, (0, 3, 1, 2))

    def compute_output_spec(self, query_positions, key_positions):
        return keras.KerasTensor(
            (
                query_positions.shape[0],
                self.num_heads,
                query_positions.shape[1],
                key_positions.shape[1],
            ),
            dtype="float32",
        )

    def get_config(self):
        config = super().get_config()
        config.update(
            num_heads=self.num_heads,
            num_buckets=self.num_buckets,
            max_distance=self.max_distance,
            bidirectional=self.bidirectional,
        )
        return config
