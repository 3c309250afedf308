"""Small configs shared by the model tests."""

from keras_moe.models import T5Config


def tiny_config(**overrides):
    args = dict(vocab_size=40, d_model=16, num_heads=2, d_kv=6, d_ff=24, num_encoder_layers=2,
                num_decoder_layers=2, dropout_rate=0.0)
    args.update(overrides)
    return T5Config(**args)


def tiny_switch_config(**overrides):
    args = dict(moe_type="switch", num_experts=4, encoder_sparse_step=2, decoder_sparse_step=1,
                activation="relu", min_expert_capacity=4)
    args.update(overrides)
    return tiny_config(**args)
