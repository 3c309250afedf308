"""quality.py's models: the dense T5.1.1 config and its Switch / GShard variants."""


def base_dense_config(args, vocab_size):
    """The benchmark's dense T5.1.1 model: `args.d_model`, heads, `d_ff`, `layers`
    encoder and decoder layers, `activation`, no dropout."""
    from keras_moe.models import T5Config

    return T5Config(
        vocab_size=vocab_size,
        d_model=args.d_model,
        num_heads=args.num_heads,
        d_kv=args.d_model // args.num_heads,
        d_ff=args.d_ff,
        num_encoder_layers=args.layers,
        num_decoder_layers=args.layers,
        activation=args.activation,
        dropout_rate=0.0,
    )


def sparse_config(dense_config, moe_type, num_experts, **layer_args):
    """`dense_config` with a Switch ("switch") or GShard ("gshard") layer of
    `num_experts` experts, of the dense FFN's size and activation, in every
    other encoder and decoder layer; `layer_args` go to the MoE layer."""
    import functools

    import keras_moe

    layer = {"switch": keras_moe.SwitchFeedForward, "gshard": keras_moe.GShardFeedForward}[moe_type]
    return dense_config.replace(
        encoder_sparse_step=2,
        decoder_sparse_step=2,
        sparse_ffn=functools.partial(
            layer,
            num_experts=num_experts,
            d_ff=dense_config.d_ff,
            activation=dense_config.activation,
            init_scale=dense_config.init_scale,
            **layer_args,
        ),
    )
