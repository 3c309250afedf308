"""Tiny teacher/student configurations and NumPy references for the distillation tests."""

import numpy as np

from tests.models.helpers import t5_config


def teacher_config(**overrides):
    """Switch teacher: encoder layer 1 sparse, both decoder layers sparse."""
    args = dict(
        vocab_size=40,
        d_model=16,
        num_heads=2,
        d_kv=6,
        d_ff=24,
        num_encoder_layers=2,
        num_decoder_layers=2,
        dropout_rate=0.0,
        moe_type="switch",
        num_experts=4,
        encoder_sparse_step=2,
        decoder_sparse_step=1,
        activation="relu",
        min_expert_capacity=4,
    )
    args.update(overrides)
    return t5_config(**args)


def batch(rng, batch_size=4, enc_len=10, dec_len=6, vocab=40):
    x = {
        "encoder_input_tokens": rng.integers(2, vocab, (batch_size, enc_len)).astype("int32"),
        "decoder_input_tokens": rng.integers(2, vocab, (batch_size, dec_len)).astype("int32"),
    }
    y = rng.integers(2, vocab, (batch_size, dec_len)).astype("int32")
    w = np.ones((batch_size, dec_len), "float32")
    w[0, dec_len - 2 :] = 0.0  # padding at the end of one sequence
    w[1, 3:] = 0.0
    return x, y, w


def np_log_softmax(z):
    z = np.asarray(z, np.float64)
    z = z - z.max(-1, keepdims=True)
    return z - np.log(np.exp(z).sum(-1, keepdims=True))


def np_distillation_loss(labels, student, teacher, weights, alpha, temperature, scale=True):
    """Float64 loop reference: (1 - a) * weighted CE(labels) + a * T^2 * weighted CE(p_T, q_T)."""
    b, length, _ = student.shape
    hard_num = soft_num = kl_num = den = 0.0
    for i in range(b):
        for j in range(length):
            w = float(weights[i, j])
            log_q1 = np_log_softmax(student[i, j])
            log_qt = np_log_softmax(np.asarray(student[i, j], np.float64) / temperature)
            log_pt = np_log_softmax(np.asarray(teacher[i, j], np.float64) / temperature)
            p_t = np.exp(log_pt)
            hard_num += w * -log_q1[labels[i, j]]
            soft_num += w * -(p_t * log_qt).sum()
            kl_num += w * (p_t * (log_pt - log_qt)).sum()
            den += w
    hard, soft = hard_num / den, soft_num / den
    if scale:
        soft *= temperature**2
    return (1 - alpha) * hard + alpha * soft, hard, soft, kl_num / den
