"""`train.dtype_policy`: the tiny Switch model trains under mixed_bfloat16.

Under "mixed_bfloat16" the weights and the optimizer state stay float32, the
layers compute in bfloat16, and the routers keep float32 (their `dtype`
defaults to "float32", `keras_moe.routing.base.Router`). The global Keras
policy is back to what it was once `train` returns.
"""

import os

import keras
import numpy as np
import pytest

from tests.training.helpers import parse


def _train(model_dir, bindings=(), model=None):
    from keras_moe.training import train_configurables

    parse(list(bindings))
    kwargs = {} if model is None else {"model": model}
    return train_configurables.train(
        str(model_dir),
        write_config=train_configurables.write_operative_config,
        tensorboard=False,
        verbose=0,
        **kwargs,
    )


@pytest.mark.slow
def test_mixed_bfloat16_trains_with_float32_weights_and_routers(tmp_path):
    from keras_moe.gin_config import model_configurables
    from keras_moe.routing.base import Router

    built = []

    def factory():
        built.append(model_configurables.build_model())
        return built[-1]

    before = keras.config.dtype_policy().name
    keras.utils.set_random_seed(0)
    summary = _train(
        tmp_path,
        ['train.dtype_policy = "mixed_bfloat16"', "TRAIN_STEPS = 12", "CheckpointConfig.every = 6"],
        model=factory,
    )
    assert keras.config.dtype_policy().name == before  # restored once train returned
    assert summary["dtype_policy"] == "mixed_bfloat16" and summary["end_step"] == 12
    model = built[0]
    assert model.compute_dtype == "bfloat16" and model.variable_dtype == "float32"
    assert {v.dtype for v in model.weights} == {"float32"}
    assert {v.dtype for v in model.optimizer.variables if "iteration" not in v.path} == {"float32"}
    layers = model._flatten_layers(include_self=False, recursive=True)
    routers = [layer for layer in layers if isinstance(layer, Router)]
    assert len(routers) == 2  # switch_tiny: one sparse layer in the encoder, one in the decoder
    assert {r.compute_dtype for r in routers} == {"float32"}
    dense = [
        layer
        for layer in model._flatten_layers(include_self=False, recursive=True)
        if isinstance(layer, keras.layers.Dense)
    ]
    assert dense and {layer.compute_dtype for layer in dense} == {"bfloat16"}
    # Held-out loss before and after the 12 steps (model.evaluate).
    start, end = summary["eval_start"]["loss"], summary["eval_end"]["loss"]
    assert np.isfinite(start) and np.isfinite(end) and end < start - 0.1, (start, end)
    config = open(tmp_path / "operative_config.gin").read()
    assert (
        "train.dtype_policy = 'mixed_bfloat16'" in config
        or 'train.dtype_policy = "mixed_bfloat16"' in config
    )


def test_the_default_is_float32_bound_on_train():
    import gin

    parse([])
    assert gin.query_parameter("train.dtype_policy") == "float32"


@pytest.mark.e2e
@pytest.mark.parametrize("value", ["fp16", "mixed_float16", 16])
def test_a_bad_policy_fails_before_anything_is_written(tmp_path, value):
    from keras_moe.training.errors import TrainingConfigError

    before = keras.config.dtype_policy().name
    with pytest.raises(
        TrainingConfigError,
        match=r"train\.dtype_policy must be one of 'float32', "
        r"'mixed_bfloat16', 'bfloat16'",
    ):
        _train(tmp_path / "bad", [f"train.dtype_policy = {value!r}"])
    assert not os.path.exists(tmp_path / "bad")
    assert keras.config.dtype_policy().name == before


def test_scope_restores_the_policy_after_an_error():
    from keras_moe.training.trainer import dtype_policy_scope

    before = keras.config.dtype_policy().name
    with pytest.raises(RuntimeError, match="inside"):
        with dtype_policy_scope("bfloat16"):
            assert keras.layers.Dense(2).variable_dtype == "bfloat16"
            raise RuntimeError("inside")
    assert keras.config.dtype_policy().name == before
