"""benchmarks/upcycle.py: each arm starts from the dense checkpoint with its Adam state."""

import tempfile

import keras
import numpy as np
import pytest

from benchmarks import upcycle
from keras_moe.models import T5Config, build_model


@pytest.mark.slow
def test_each_arm_starts_at_the_dense_run_step_with_its_layers():
    dense_config = T5Config(
        vocab_size=64,
        d_model=16,
        num_heads=2,
        d_kv=8,
        d_ff=128,
        num_encoder_layers=2,
        num_decoder_layers=2,
        activation="gated-gelu",
        dropout_rate=0.0,
    )
    configs = upcycle.arm_configs(dense_config)
    assert list(configs) == list(upcycle.ARMS)
    keras.utils.set_random_seed(0)
    dense = build_model(dense_config)
    dense.compile(**dense.compile_defaults(optimizer=keras.optimizers.Adam(1e-3)))
    x = {
        "encoder_input_tokens": np.full((2, 6), 5, "int32"),
        "decoder_input_tokens": np.full((2, 4), 6, "int32"),
    }
    for _ in range(3):
        dense.train_on_batch(x, np.full((2, 4), 7, "int32"), np.ones((2, 4), "float32"))

    with tempfile.TemporaryDirectory() as folder:
        checkpoint = f"{folder}/dense.weights.h5"
        dense.save_weights(checkpoint)
        for arm, (config, router_init) in configs.items():
            model = upcycle.continue_run(config, router_init, checkpoint, 0, 1e-3)
            assert int(model.optimizer.iterations.numpy()) == 3, arm
            ffn = model.encoder_layers[1].ffn
            experts = getattr(ffn, "num_experts", None)
            assert (
                experts == {"dense": None, "switch8_upcycled": 8, "fg32_top4_upcycled": 32}[arm]
            ), (arm, type(ffn).__name__)
