"""benchmarks/recipes.py: every recipe builds, at the dense model's FLOPs per token."""

import pytest

from benchmarks import recipes
from keras_moe.models import T5Config, build_model


@pytest.mark.parametrize("name", sorted(recipes.RECIPES))
def test_each_recipe_has_the_dense_ffn_flops_per_token(name):
    args, _ = recipes.parse_args(["--recipes", name])
    dense = T5Config(
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
    config = recipes.recipe_config(dense, args, name)
    spec = config.sparse_ffn_view("encoder")
    shared = spec.get("shared_d_ff") or 0
    assert spec.get("k") * spec.get("d_ff") + shared == dense.d_ff  # k routed + shared widths
    assert spec.get("num_experts") == 32
    model = build_model(config)
    assert model.count_params() > 0
