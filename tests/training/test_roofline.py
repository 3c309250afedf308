"""The roofline bound: collective bytes from HLO text, model FLOPs from a hand count."""

import pytest

from keras_moe.models import EncoderDecoder
from keras_moe.tpu_compile import roofline
from tests.models.helpers import tiny_config

# Compiled-HLO lines as the TPU compiler writes them: operands without types, layouts with
# parentheses, listed, iota and mesh replica groups, an async all-gather, a tuple all-reduce.
HLO = """
  %all_to_all.104 = bf16[8,2,4,64]{3,2,1,0:T(8,128)(2,1)S(1)} all-to-all(%reshape.793), channel_id=1, replica_groups={{0,1,2,3},{4,5,6,7}}, dimensions={0}
  %all-gather-start.2 = (f32[16,32]{1,0}, f32[128,32]{1,0}) all-gather-start(%p), channel_id=4, replica_groups=[1,8]<=[8], dimensions={0}
  %all-gather-done.2 = f32[128,32]{1,0} all-gather-done(%all-gather-start.2)
  %all-reduce.60 = (f32[100]{0:T(128)}, f32[28]{0:T(128)}) all-reduce(%a, %b), channel_id=4, replica_groups=mesh['axis_0'=4,'axis_1'=2] {'axis_0','axis_1'}, use_global_device_ids=true, to_apply=%add
  %reduce-scatter.1 = bf16[6]{0} reduce-scatter(%r), channel_id=7, replica_groups=mesh['axis_0'=4,'axis_1'=2] {'axis_1'}, dimensions={0}
  %collective-permute.3 = s32[10]{0} collective-permute(%c), channel_id=6, source_target_pairs={{0,1},{1,0}}
  %fusion.9 = f32[4]{0} fusion(%all_to_all.104), kind=kLoop, calls=%fused
"""  # noqa: E501 - verbatim output lines


def test_collective_bytes_count_what_each_chip_must_send():
    sent = roofline.collective_bytes(HLO, num_devices=8)
    assert sent == pytest.approx(
        {
            "all_to_all": 8 * 2 * 4 * 64 * 2 * 3 / 4,  # groups of 4: 3/4 of the buffer leaves
            "all_gather": 16 * 32 * 4 * 7,  # its 16-row shard to each of the 7 others
            "all_reduce": (100 + 28) * 4 * 2 * 7 / 8,  # reduce-scatter + all-gather, 8 chips
            "reduce_scatter": 6 * 2 * 1,  # groups of 2: the other chip's block
            "collective_permute": 10 * 4,
        }
    )


def test_model_flops_match_a_hand_count():
    """tiny_config: d 16, 2 heads of 6, d_ff 24 (gated-gelu: 3 matrices), vocab 40, 2 + 2
    layers, untied embeddings."""
    model = EncoderDecoder(tiny_config())
    batch, inputs, targets = 3, 10, 4
    d, inner, d_ff, vocab = 16, 12, 24, 40
    attention = 4 * d * inner
    encoder_params = 2 * (attention + 3 * d * d_ff)
    decoder_params = 2 * (2 * attention + 3 * d * d_ff)
    cross_kv = 2 * (2 * d * inner)  # keys and values of the encoder outputs
    matmul = 6 * (
        encoder_params * batch * inputs
        + (decoder_params - cross_kv) * batch * targets
        + cross_kv * batch * inputs
        + vocab * d * batch * targets
    )
    scores = (
        3 * 4 * batch * inner * (2 * inputs * inputs + 2 * targets * targets + 2 * targets * inputs)
    )
    assert roofline.model_flops_per_step(model, batch, inputs, targets) == matmul + scores


def test_model_flops_count_k_of_the_experts():
    dense = EncoderDecoder(tiny_config())
    sparse = EncoderDecoder(
        tiny_config(moe_type="gshard", num_experts=4, encoder_sparse_step=1, decoder_sparse_step=1)
    )
    # Top-2 of 4 experts of the dense FFN's shape: twice the dense FFN's FLOPs.
    ffn = 3 * 16 * 24
    extra = 6 * ffn * (2 * 3 * 10 + 2 * 3 * 4)  # one more FFN per layer and token
    assert (
        roofline.model_flops_per_step(sparse, 3, 10, 4)
        == roofline.model_flops_per_step(dense, 3, 10, 4) + extra
    )


def test_the_bound_is_the_slowest_resource():
    chip = roofline.CHIPS["v5p"]
    result = roofline.estimate(
        chip.peak_flops * 0.002,
        chip.hbm_bytes_per_second * 0.003,
        {"all_to_all": chip.ici_bytes_per_second / 2 * 0.001},
        "v5p",
        model_flops_per_chip=chip.peak_flops * 0.0015,
    )
    assert result["bound_by"] == "memory"
    assert result["bound_seconds"] == pytest.approx(0.003)
    assert result["ici_seconds"] == pytest.approx(0.001)
    assert result["mfu_at_bound"] == pytest.approx(0.5)
    assert roofline.estimate(1.0, 0.0, {}, "v9z") is None
