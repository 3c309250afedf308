"""Switch Table 2 in miniature: float32 router under mixed_bfloat16, 0.1x init, NaN stops a run."""

import os

import keras
import numpy as np
import pytest

from keras_moe.models import build_model
from tests.models.helpers import t5_config
from tests.reliability import helpers


def _config(**kw):
    base = dict(
        vocab_size=64,
        d_model=32,
        num_heads=2,
        d_kv=16,
        d_ff=64,
        num_encoder_layers=2,
        num_decoder_layers=2,
        moe_type="switch",
        num_experts=4,
        encoder_sparse_step=1,
        decoder_sparse_step=1,
        min_expert_capacity=1,
    )
    base.update(kw)
    return t5_config(**base)


def _batches(n=6, batch=8, seed=0):
    rng = np.random.default_rng(seed)
    x = {
        "encoder_input_tokens": rng.integers(2, 64, (n * batch, 12)).astype("int32"),
        "decoder_input_tokens": rng.integers(2, 64, (n * batch, 6)).astype("int32"),
    }
    return x, rng.integers(2, 64, (n * batch, 6)).astype("int32")


def _routers(model):
    return [sub for sub in model._flatten_layers() if type(sub).__name__.endswith("Router")]


@pytest.mark.slow
@pytest.mark.parametrize("router_dtype", ["float32", "bfloat16"])
def test_mixed_bfloat16_training_with_a_float32_router_stays_finite(router_dtype):
    keras.mixed_precision.set_global_policy("mixed_bfloat16")
    keras.utils.set_random_seed(0)
    model = build_model(_config(router_dtype=router_dtype))
    model.compile(**model.compile_defaults(learning_rate=1e-2))
    stable = router_dtype == "float32"  # the configuration that must be stable
    # The bfloat16 router only has to build and run: one step.
    x, y = _batches(n=6 if stable else 1)
    history = model.fit(x, y, batch_size=8, epochs=2 if stable else 1, verbose=0)
    routers = _routers(model)
    assert len(routers) == 4
    for router in routers:
        assert router.compute_dtype == router_dtype
        assert router.kernel.dtype == ("float32" if router_dtype == "float32" else "bfloat16")
    losses = history.history["loss"]
    if stable:
        assert all(np.isfinite(losses)) and losses[-1] < losses[0], losses


def test_router_dtype_is_validated_and_gin_configurable():
    with pytest.raises(ValueError, match="router_dtype"):
        _config(router_dtype="float8")
    gshard = build_model(_config(router_dtype="bfloat16", moe_type="gshard"))
    gshard(
        {
            "encoder_input_tokens": np.ones((1, 4), "int32"),
            "decoder_input_tokens": np.zeros((1, 4), "int32"),
        }
    )
    routers = [layer for layer in gshard._flatten_layers() if layer.name == "router"]
    assert routers and all(r.dtype_policy.name == "bfloat16" for r in routers)
    helpers.parse(["SwitchFeedForward.router_dtype = 'bfloat16'"])
    from keras_moe.gin_config import model_configurables

    assert model_configurables.build_model().config.sparse_option("router_dtype") == "bfloat16"
    import gin

    gin.clear_config()


def _built_switch_model(d_model, d_ff=512):
    keras.utils.set_random_seed(0)
    model = build_model(
        _config(
            d_model=d_model,
            d_ff=d_ff,
            d_kv=32,
            num_encoder_layers=1,
            num_decoder_layers=1,
            num_experts=8,
        )
    )
    model(
        {
            "encoder_input_tokens": np.ones((1, 4), "int32"),
            "decoder_input_tokens": np.zeros((1, 4), "int32"),
        }
    )
    return model


@pytest.mark.parametrize("init_scale", [1.0, 0.1])
def test_router_init_follows_the_model_init_scale(init_scale):
    d_model = 256
    keras.utils.set_random_seed(0)
    model = build_model(
        _config(
            d_model=d_model,
            d_ff=512,
            d_kv=32,
            num_encoder_layers=1,
            num_decoder_layers=1,
            num_experts=8,
            init_scale=init_scale,
        )
    )
    model(
        {
            "encoder_input_tokens": np.ones((1, 4), "int32"),
            "decoder_input_tokens": np.zeros((1, 4), "int32"),
        }
    )
    for router in _routers(model):
        std = float(np.std(router.kernel.numpy()))
        assert std == pytest.approx(np.sqrt(init_scale / d_model), rel=0.1), router.path


def test_default_expert_init_is_the_t5_fan_in_init_per_expert():
    model = _built_switch_model(256)
    experts = [sub for sub in model._flatten_layers() if type(sub).__name__ == "FeedForwardExperts"]
    assert experts
    for layer in experts:
        for w in layer.weights:
            fan_in = w.shape[-2]  # Per expert: [E, fan_in, fan_out].
            std = float(np.std(w.numpy()))
            assert std == pytest.approx(np.sqrt(1.0 / fan_in), rel=0.1), (w.path, fan_in, std)


@pytest.mark.slow
def test_nan_loss_stops_training_naming_the_step_without_a_checkpoint(tmp_path, capsys):
    from keras_moe.training import checkpoint as ckpt_lib
    from keras_moe.training import train_cli

    model_dir = tmp_path / "run"
    args = ["--gin_file=tiny_local.gin", f"--model_dir={model_dir}"] + helpers.cli_bindings(
        helpers.FAST
        + ["TRAIN_STEPS = 20", "CheckpointConfig.every = 1", "make_optimizer.learning_rate = 1e30"]
    )
    import gin

    gin.clear_config()
    assert train_cli.main(args) == 3
    err = capsys.readouterr().err
    assert "training loss became nan at step" in err, err[-2000:]
    step = int(err.split("at step ")[1].split(":")[0])
    assert step >= 1
    manager = ckpt_lib.CheckpointManager(os.path.join(model_dir, "checkpoints"))
    saved = [m["step"] for m in manager.all()]
    assert step not in saved and all(s < step for s in saved), (step, saved)
    assert not os.path.exists(os.path.join(model_dir, "summary.json"))
