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
        cache: optional `(k, v)` each `[B, H, T, d_kv]` (heads first, so a
            decoding step multiplies without transposing the cache; see
            `compute_kv_cache`). With `cache_index` (self-attention
            decoding), the new keys/values of `x` are written at
            `cache_index` and attention runs over the whole cache (mask
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
        self.query = self.add_weight(
            name="query", shape=(d, inner), initializer=normal(d * self.d_kv)
        )
        self.key = self.add_weight(name="key", shape=(d, inner), initializer=normal(d))
        self.value = self.add_weight(name="value", shape=(d, inner), initializer=normal(d))
        self.output_kernel = self.add_weight(
            name="output", shape=(inner, d), initializer=normal(inner)
        )
        self.built = True

    def _heads(self, x):
        shape = ops.shape(x)
        return ops.reshape(x, (shape[0], shape[1], self.num_heads, self.d_kv))

    def compute_kv(self, kv):
        """Keys and values `[B, Lk, H, d_kv]` of `kv`."""
        return (self._heads(ops.matmul(kv, self.key)), self._heads(ops.matmul(kv, self.value)))

    def compute_kv_cache(self, kv):
        """Keys and values `[B, H, Lk, d_kv]` of `kv`: a cross-attention cache."""
        return tuple(ops.transpose(t, (0, 2, 1, 3)) for t in self.compute_kv(kv))

    def call(self, x, kv=None, bias=None, cache=None, cache_index=None, training=None):
        if cache is not None:
            return self._call_cached(x, bias, cache, cache_index, training)
        q = self._heads(ops.matmul(x, self.query))
        k, v = self.compute_kv(x if kv is None else kv)
        scores = ops.einsum("bqhd,bkhd->bhqk", ops.cast(q, "float32"), ops.cast(k, "float32"))
        weights = self._attention_weights(scores, bias, training)
        context = ops.einsum("bhqk,bkhd->bqhd", weights, ops.cast(v, self.compute_dtype))
        return self._output(context)

    def _call_cached(self, x, bias, cache, cache_index, training):
        # Heads-first einsums contract the cache's last axis in place; the
        # [B, T, H, d] layout made TensorFlow transpose the whole cache per step.
        q = ops.transpose(self._heads(ops.matmul(x, self.query)), (0, 2, 1, 3))
        if cache_index is None:
            k, v = cache
        else:
            start = [0, 0, cache_index, 0]
            k, v = (
                ops.slice_update(old, start, ops.cast(new, old.dtype))
                for old, new in zip(cache, self.compute_kv_cache(x), strict=False)
            )
        scores = ops.einsum("bhqd,bhkd->bhqk", ops.cast(q, "float32"), ops.cast(k, "float32"))
        weights = self._attention_weights(scores, bias, training)
        context = ops.einsum("bhqk,bhkd->bhqd", weights, ops.cast(v, self.compute_dtype))
        return self._output(ops.transpose(context, (0, 2, 1, 3))), (k, v)

    def _attention_weights(self, scores, bias, training):
        if bias is not None:
            scores = scores + ops.cast(bias, "float32")  # bias is bf16 under mixed_bfloat16
        weights = ops.softmax(scores, axis=-1)
        return self.dropout(ops.cast(weights, self.compute_dtype), training=training)

    def _output(self, context):
        """Context `[B, Lq, H, d_kv]` -> output `[B, Lq, d]`."""
        shape = ops.shape(context)
        context = ops.reshape(context, (shape[0], shape[1], self.num_heads * self.d_kv))
        return ops.matmul(context, self.output_kernel)

    def get_config(self):
        config = super().get_config()
        config.update(
            num_heads=self.num_heads,
            d_kv=self.d_kv,
            dropout_rate=self.dropout_rate,
            init_scale=self.init_scale,
            seed=self.seed,
        )
        return config
