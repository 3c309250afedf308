"""T5 multi-head attention: no biases, no 1/sqrt(d) scaling, additive bias, key/value cache."""

import keras
from keras import ops

NEG_INF = -1e9


@keras.saving.register_keras_serializable(package="keras_moe")
class T5Attention(keras.layers.Layer):
    """Multi-head attention as in T5 (Mesh TensorFlow).

    Scores are `q . k` without the `1/sqrt(d_kv)` factor (T5 folds it into the
    query init), plus an additive float32 `bias` `[B or 1, H or 1, Lq, Lk]`
    that carries the relative position bias and the masks (`NEG_INF` where a
    key is hidden). `d_kv` is independent of `d_model / num_heads`.

    Args:
        num_heads: number of heads.
        d_kv: size of one head.
        dropout_rate: dropout on the attention weights.
        init_scale: variance scale of the normal init (T5: 1.0).
        seed: dropout seed.

    Call args:
        x: queries' input `[B, Lq, d]`.
        kv: keys'/values' input `[B, Lk, d]`; None: self-attention on `x`.
        bias: additive bias (position bias + mask), broadcastable to `[B, H, Lq, Lk]`.
        cache: optional `(k, v)` each `[B, T, H, d_kv]`. With `cache_index`
            (self-attention decoding), the new keys/values of `x` are written
            at `cache_index` and attention runs over the whole cache (mask
            future slots through `bias`). Without `cache_index` the cache is
            used as precomputed keys/values (cross-attention).
        cache_index: int slot of the first query in the cache.

    Returns:
        `out [B, Lq, d]`, or `(out, (k, v))` when `cache` is given.

    Example:
    >>> import numpy as np
    >>> attn = T5Attention(num_heads=4, d_kv=8)
    >>> y = attn(np.ones((2, 5, 16), "float32"))  # self-attention, no bias
    >>> tuple(y.shape)
    (2, 5, 16)
    """

    def __init__(self, num_heads, d_kv, dropout_rate=0.0, init_scale=1.0, seed=None, **kwargs):
        super().__init__(**kwargs)
        if not init_scale > 0:
            raise ValueError(f"`init_scale` must be > 0, got {init_scale!r}.")
        self.num_heads = num_heads
        self.d_kv = d_kv
        self.dropout_rate = float(dropout_rate)
        self.init_scale = float(init_scale)
        self.seed = seed
        self.dropout = keras.layers.Dropout(self.dropout_rate, seed=seed, dtype=self.dtype_policy)

    def build(self, input_shape):
        d = input_shape[-1]
        inner = self.num_heads * self.d_kv

        def normal(fan_in):  # one object per weight: unseeded ones repeat their values
            return keras.initializers.RandomNormal(stddev=(self.init_scale / fan_in) ** 0.5)

        # T5 folds the 1/sqrt(d_kv) attention scaling into the query's init.
        self.query = self.add_weight(name="query", shape=(d, inner),
                                     initializer=normal(d * self.d_kv))
        self.key = self.add_weight(name="key", shape=(d, inner), initializer=normal(d))
        self.value = self.add_weight(name="value", shape=(d, inner), initializer=normal(d))
        self.output_kernel = self.add_weight(name="output", shape=(inner, d),
                                             initializer=normal(inner))
        self.built = True

    def _heads(self, x):
        shape = ops.shape(x)
        return ops.reshape(x, (shape[0], shape[1], self.num_heads, self.d_kv))

    def compute_kv(self, kv):
        """Keys and values `[B, Lk, H, d_kv]` of `kv` (for a cross-attention cache)."""
        return (self._heads(ops.matmul(kv, self.key)), self._heads(ops.matmul(kv, self.value)))

    def call(self, x, kv=None, bias=None, cache=None, cache_index=None, training=None):
        q = self._heads(ops.matmul(x, self.query))
        if cache is not None and cache_index is None:
            k, v = cache
        else:
            k, v = self.compute_kv(x if kv is None else kv)
            if cache is not None:
                k_cache, v_cache = cache
                start = [0, cache_index, 0, 0]
                k = ops.slice_update(k_cache, start, ops.cast(k, k_cache.dtype))
                v = ops.slice_update(v_cache, start, ops.cast(v, v_cache.dtype))
        scores = ops.einsum("bqhd,bkhd->bhqk", ops.cast(q, "float32"), ops.cast(k, "float32"))
        if bias is not None:
            scores = scores + ops.cast(bias, "float32")  # bias is bf16 under mixed_bfloat16
        weights = ops.softmax(scores, axis=-1)
        weights = self.dropout(ops.cast(weights, self.compute_dtype), training=training)
        context = ops.einsum("bhqk,bkhd->bqhd", weights, ops.cast(v, self.compute_dtype))
        shape = ops.shape(context)
        context = ops.reshape(context, (shape[0], shape[1], self.num_heads * self.d_kv))
        out = ops.matmul(context, self.output_kernel)
        if cache is not None:
            return out, (k, v)
        return out

    def get_config(self):
        config = super().get_config()
        config.update(num_heads=self.num_heads, d_kv=self.d_kv, dropout_rate=self.dropout_rate,
                      init_scale=self.init_scale, seed=self.seed)
        return config
