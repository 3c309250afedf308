import math

import numpy as np
import pytest
from keras import ops

from keras_moe.models import EncoderDecoder, RMSNorm, T5Attention, relative_position_bucket
from keras_moe.models.attention import NEG_INF
from tests.models.helpers import tiny_config, tiny_switch_config


def np_bucket(rel, bidirectional, num_buckets, max_distance):
    """Float64 NumPy reference of Mesh TensorFlow's `_relative_position_bucket`."""
    out = np.zeros_like(rel)
    for idx, r in np.ndenumerate(rel):
        n = -int(r)
        ret = 0
        nb = num_buckets
        if bidirectional:
            nb //= 2
            if n < 0:
                ret += nb
            n = abs(n)
        else:
            n = max(n, 0)
        max_exact = nb // 2
        if n < max_exact:
            ret += n
        else:
            val = max_exact + int(
                math.log(n / max_exact) / math.log(max_distance / max_exact) * (nb - max_exact)
            )
            ret += min(val, nb - 1)
        out[idx] = ret
    return out


@pytest.mark.parametrize("bidirectional", [True, False])
@pytest.mark.parametrize("num_buckets,max_distance", [(32, 128), (8, 20)])
def test_relative_position_bucket_matches_reference(bidirectional, num_buckets, max_distance):
    rel = np.arange(-300, 301)
    got = np.asarray(
        ops.convert_to_numpy(
            relative_position_bucket(rel, bidirectional, num_buckets, max_distance)
        )
    )
    want = np_bucket(rel, bidirectional, num_buckets, max_distance)
    np.testing.assert_array_equal(got, want)
    assert got.min() >= 0 and got.max() < num_buckets
    if not bidirectional:
        assert (got[rel > 0] == 0).all()  # the future shares bucket 0


def test_rms_norm_matches_numpy(rng):
    x = rng.normal(size=(2, 3, 8)).astype("float32")
    layer = RMSNorm(epsilon=1e-6)
    layer.build(x.shape)
    scale = rng.normal(size=8).astype("float32")
    layer.scale.assign(scale)
    x64 = x.astype(np.float64)
    want = x64 / np.sqrt((x64**2).mean(-1, keepdims=True) + 1e-6) * scale
    np.testing.assert_allclose(ops.convert_to_numpy(layer(x)), want, rtol=1e-5, atol=1e-6)


def test_attention_matches_numpy(rng):
    b, lq, lk, d, h, dk = 2, 3, 4, 8, 3, 5
    x = rng.normal(size=(b, lq, d)).astype("float32")
    kv = rng.normal(size=(b, lk, d)).astype("float32")
    bias = rng.normal(size=(b, h, lq, lk)).astype("float32")
    bias[0, :, :, -1] = NEG_INF
    attn = T5Attention(num_heads=h, d_kv=dk)
    got = ops.convert_to_numpy(attn(x, kv=kv, bias=bias))
    wq, wk, wv, wo = (
        np.asarray(ops.convert_to_numpy(w), np.float64)
        for w in (attn.query, attn.key, attn.value, attn.output_kernel)
    )
    q = (x @ wq).reshape(b, lq, h, dk)
    k = (kv @ wk).reshape(b, lk, h, dk)
    v = (kv @ wv).reshape(b, lk, h, dk)
    s = np.einsum("bqhd,bkhd->bhqk", q, k) + bias  # no 1/sqrt(d_kv) in T5
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    want = np.einsum("bhqk,bkhd->bqhd", p, v).reshape(b, lq, h * dk) @ wo
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def _logits(model, enc, dec, **extra):
    feats = {
        "encoder_input_tokens": np.asarray(enc, "int32"),
        "decoder_input_tokens": np.asarray(dec, "int32"),
    }
    feats.update({k: np.asarray(v, "int32") for k, v in extra.items()})
    return np.asarray(ops.convert_to_numpy(model(feats)))


@pytest.mark.parametrize(
    "make",
    [tiny_config, lambda: tiny_switch_config(min_expert_capacity=32)],
    ids=["dense", "switch"],
)
def test_packed_equals_separate(make):
    model = EncoderDecoder(make())
    a_enc, a_dec = [5, 6, 7, 1], [0, 8, 9]
    b_enc, b_dec = [11, 12, 1], [0, 13, 14, 15]
    packed = _logits(
        model,
        [a_enc + b_enc + [0]],
        [a_dec + b_dec + [0]],
        encoder_segment_ids=[[1] * 4 + [2] * 3 + [0]],
        encoder_positions=[[0, 1, 2, 3, 0, 1, 2, 0]],
        decoder_segment_ids=[[1] * 3 + [2] * 4 + [0]],
        decoder_positions=[[0, 1, 2, 0, 1, 2, 3, 0]],
    )
    alone_a = _logits(model, [a_enc], [a_dec])
    alone_b = _logits(model, [b_enc], [b_dec])
    np.testing.assert_allclose(packed[0, :3], alone_a[0], atol=1e-4)
    np.testing.assert_allclose(packed[0, 3:7], alone_b[0], atol=1e-4)


def test_packing_without_segments_would_differ():
    """The segment masks matter: ignoring them changes the logits (test can fail)."""
    model = EncoderDecoder(tiny_config())
    enc, dec = [[5, 6, 7, 1, 11, 12, 1]], [[0, 8, 9, 0, 13, 14, 15]]
    plain = _logits(model, enc, dec)
    packed = _logits(
        model,
        enc,
        dec,
        encoder_segment_ids=[[1] * 4 + [2] * 3],
        decoder_segment_ids=[[1] * 3 + [2] * 4],
    )
    assert np.abs(plain[0, 3:] - packed[0, 3:]).max() > 1e-3


@pytest.mark.parametrize(
    "make",
    [tiny_config, lambda: tiny_switch_config(min_expert_capacity=32)],
    ids=["dense", "switch"],
)
def test_padding_does_not_change_real_logits(make):
    model = EncoderDecoder(make())
    short = _logits(model, [[5, 6, 7, 1]], [[0, 8, 9]])
    padded = _logits(model, [[5, 6, 7, 1, 0, 0, 0]], [[0, 8, 9, 0, 0]])
    np.testing.assert_allclose(padded[0, :3], short[0], atol=1e-5)


def test_decoder_is_causal():
    model = EncoderDecoder(tiny_switch_config(min_expert_capacity=32))
    a = _logits(model, [[5, 6, 1]], [[0, 8, 9, 10]])
    b = _logits(model, [[5, 6, 1]], [[0, 8, 30, 31]])
    np.testing.assert_allclose(a[0, :2], b[0, :2], atol=1e-5)
    assert np.abs(a[0, 2:] - b[0, 2:]).max() > 1e-4


def test_gated_dense_ffn_starts_with_independent_kernels():
    """wi_0 and wi_1 must not share their initial values (one unseeded
    initializer object used twice repeats them)."""
    from keras_moe.layers.dense_feedforward import DenseFeedForward

    ffn = DenseFeedForward(d_ff=256, activation="gated-gelu")
    ffn.build((None, None, 64))
    wi_0, wi_1 = np.ravel(ffn.wi_0.numpy()), np.ravel(ffn.wi_1.numpy())
    assert abs(np.corrcoef(wi_0, wi_1)[0, 1]) < 0.05
    # T5's fan-in init: std sqrt(1 / 64) for wi, sqrt(1 / 256) for wo.
    np.testing.assert_allclose([wi_0.std(), np.std(ffn.wo.numpy())], [1 / 8, 1 / 16], rtol=0.05)


def test_model_init_scale_scales_every_weight():
    """T5Config.init_scale reaches attention, dense FFNs and embeddings; the sparse FFN's
    own `init_scale` its experts and router."""
    import keras

    from keras_moe.models import build_model

    def stds(scale):
        keras.utils.set_random_seed(0)
        model = build_model(tiny_switch_config(init_scale=scale, expert_init_scale=scale))
        return {
            v.path: float(np.std(v.numpy()))
            for v in model.weights
            if v.path.split("/")[-1] in ("query", "wi_0", "wo", "kernel", "embeddings")
            and "position_bias" not in v.path
        }  # T5 keeps the bias table at std 1

    full, tenth = stds(1.0), stds(0.1)
    assert {p.split("/")[-2] for p in full} >= {"experts", "router"}
    for path, std in full.items():
        np.testing.assert_allclose(tenth[path] / std, 0.1**0.5, rtol=0.1, err_msg=path)


@pytest.mark.parametrize("moe_type", ["switch", "gshard"])
def test_sparse_ffn_is_the_ready_made_layer_with_the_configs_router(moe_type):
    """Both MoE types take `router_bias` and `router_dtype` from the config
    (GShard refused both before), through the ready-made layers."""
    import keras_moe
    from keras_moe.models.ffn_factories import sparse_ffn_factory

    config = tiny_switch_config(
        moe_type=moe_type, router_bias=True, router_dtype="bfloat16", init_scale=0.5
    )
    ffn = sparse_ffn_factory(config, "decoder")(name="ffn")
    expected = keras_moe.GShardFeedForward if moe_type == "gshard" else keras_moe.SwitchFeedForward
    assert type(ffn) is expected
    y = ffn(np.ones((2, 4, config.d_model), "float32"))
    assert tuple(y.shape) == (2, 4, config.d_model)
    assert ffn.router.use_bias and ffn.router.bias.path.endswith("router/bias")
    assert ffn.router.dtype_policy.name == "bfloat16" and ffn.causal
    # the router follows the layer's init scale: std sqrt(0.5 / d_model)
    std = float(np.std(ffn.router.kernel.numpy()))
    assert std == pytest.approx((0.5 / config.d_model) ** 0.5, rel=0.35)
