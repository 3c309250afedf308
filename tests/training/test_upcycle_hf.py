"""Upcycling a Hugging Face T5 v1.1 checkpoint (weights only) into a MoE model.

The reference is HF's own T5 (torch) on the same tokens: the upcycled model,
top-1 with its gate renormalised to 1, must give its logits.
"""

import dataclasses

import numpy as np
import torch
import transformers

from keras_moe import TopKFeedForward
from keras_moe.convert import from_hf
from keras_moe.models import EncoderDecoder
from keras_moe.training.checkpoint.upcycle_checkpoint import Upcycle, load_upcycled
from keras_moe.training.run.schedules import make_optimizer

ENC = np.array([[5, 6, 7, 8, 9, 10, 11, 12, 1, 0], [13, 14, 15, 16, 17, 1, 0, 0, 0, 0]])
DEC = np.array([[0, 3, 4, 5, 6, 7], [0, 9, 10, 11, 12, 13]])


def test_a_hf_t5_v1_1_checkpoint_upcycles_to_a_moe_with_its_logits(tmp_path):
    torch.manual_seed(1)
    hf = transformers.T5ForConditionalGeneration(
        transformers.T5Config(
            vocab_size=60,
            d_model=16,
            d_kv=6,
            d_ff=24,
            num_layers=2,
            num_decoder_layers=3,
            num_heads=3,
            feed_forward_proj="gated-gelu",
            tie_word_embeddings=False,
            relative_attention_num_buckets=8,
            relative_attention_max_distance=16,
        )
    ).eval()
    hf.save_pretrained(str(tmp_path))
    with torch.no_grad():
        want = hf(
            input_ids=torch.tensor(ENC),
            attention_mask=torch.tensor(ENC > 0),
            decoder_input_ids=torch.tensor(DEC),
        ).logits.numpy()

    dense_config = from_hf(str(tmp_path)).config
    sparse = EncoderDecoder(
        dataclasses.replace(
            dense_config,
            encoder_sparse_step=2,
            decoder_sparse_step=2,
            sparse_ffn=TopKFeedForward(
                num_experts=4,
                d_ff=24,
                k=1,
                normalize_top_k=True,
                eval_capacity_factor=4.0,
                activation="gated-gelu",
            ),
        )
    )
    sparse.compile(**sparse.compile_defaults(optimizer=make_optimizer(name="adafactor")))
    report = load_upcycled(sparse, str(tmp_path), Upcycle())
    assert report["step"] == 0 and len(report["experts"]) == 6  # 2 MoE layers x wi_0/wi_1/wo
    got = np.asarray(
        sparse(
            {
                "encoder_input_tokens": ENC.astype("int32"),
                "decoder_input_tokens": DEC.astype("int32"),
            }
        )
    )
    np.testing.assert_allclose(got, want, atol=1e-4)
