"""`keras_moe.sparsify` on keras-hub's MoE families, against keras-hub's dense blocks and
HF torch, on TensorFlow here and on JAX in a subprocess (jax_checks.py)."""

import os
import subprocess
import sys

import keras
import keras_hub
import numpy as np
import pytest

import keras_moe
from tests.keras_hub import checks
from tests.keras_hub.hf_checkpoints import (
    FAMILIES,
    write_checkpoint,
    write_checkpoints,
    write_mxfp4_gpt_oss,
)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    return write_checkpoints(str(tmp_path_factory.mktemp("hf_moe")))


@pytest.mark.parametrize("family", FAMILIES)
def test_logits_equal_keras_hub_and_hf_torch(folders, family):
    checks.check_logits(folders[family])


@pytest.mark.parametrize("family", FAMILIES)
def test_greedy_generate_gives_the_same_tokens(folders, family):
    checks.check_greedy_generate(folders[family])


@pytest.mark.parametrize("family", ("Mixtral", "QwenMoe", "GptOss"))
def test_training_adds_the_family_balance_loss_and_logs_router_metrics(folders, family):
    checks.check_training_losses_and_metrics(folders[family])


@pytest.mark.parametrize("family", ("Qwen3Moe", "GptOss"))
def test_a_saved_sparse_model_loads_sparse(folders, family, tmp_path):
    checks.check_save_and_load(folders[family], str(tmp_path))


def test_a_preset_saved_sparse_loads_sparse_through_keras_hub_and_keras_moe(folders, tmp_path):
    model = checks.load(folders["Qwen3Moe"])
    want = checks.logits(model, checks.batch())
    model.save_to_preset(str(tmp_path))
    for load in (
        keras_moe.from_preset,
        keras_hub.models.CausalLM.from_preset,
        keras_hub.models.Qwen3MoeCausalLM.from_preset,
    ):
        loaded = load(str(tmp_path))
        assert type(loaded) is type(model), (load, type(loaded))
        np.testing.assert_array_equal(checks.logits(loaded, checks.batch()), want)


@pytest.mark.jax
@pytest.mark.slow
def test_the_same_checks_on_jax(folders, tmp_path):
    env = dict(os.environ, KERAS_BACKEND="jax", JAX_PLATFORMS="cpu", TF_CPP_MIN_LOG_LEVEL="3")
    script = os.path.join(ROOT, "tests", "keras_hub", "jax_checks.py")
    result = subprocess.run(
        [sys.executable, script, os.path.dirname(folders["Mixtral"]), str(tmp_path)],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    for family in FAMILIES:
        assert f"OK {family}" in result.stdout, result.stdout


@pytest.mark.jax
@pytest.mark.slow
def test_experts_split_over_a_jax_mesh_give_the_one_device_logits(folders):
    """8 emulated devices, mesh {data: 2, expert: 4}: expert weights sharded over
    "expert", tokens moved by all-to-all, no expert weight gathered."""
    families = ("GptOss",)  # its expert biases are split too; the other families share the path
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    script = os.path.join(ROOT, "tests", "keras_hub", "mesh_checks.py")
    result = subprocess.run(
        [sys.executable, script, os.path.dirname(folders["Mixtral"]), *families],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    for family in families:
        assert f"OK {family}" in result.stdout, result.stdout


def test_gpt_oss_loads_from_mxfp4_experts_as_from_the_plain_ones(tmp_path):
    """Published gpt-oss checkpoints store experts as MXFP4 blocks and scales: loaded
    through keras-hub's converter, they give the logits of the same experts dequantized
    by an independent NumPy decoder and stored plain."""
    plain = write_checkpoint("GptOss", str(tmp_path / "plain"), intermediate_size=32)
    plain, mxfp4 = write_mxfp4_gpt_oss(plain, str(tmp_path / "mxfp4"))
    inputs = checks.batch()
    want = checks.logits(checks.load(plain), inputs)
    checks.assert_close(checks.logits(checks.load(mxfp4), inputs), want, "MXFP4 vs plain")


def test_moe_weights_are_moved_not_held_twice(folders):
    dense = checks.load(folders["QwenMoe"], sparse=False)
    count = sum(int(np.prod(w.shape)) for w in dense.weights)
    sparse = keras_moe.sparsify(dense)
    assert sum(int(np.prod(w.shape)) for w in sparse.weights) == count
    names = {w.path for w in sparse.weights}
    assert not any("expert_feedforward_gate_dense" in name for name in names), sorted(names)


def test_capacity_dispatch_is_an_option(folders):
    model = checks.load(folders["Mixtral"], dispatch="gather", eval_capacity_factor=8.0)
    got = checks.logits(model, checks.batch())
    want = checks.logits(checks.load(folders["Mixtral"]), checks.batch())
    mask = checks.batch()["padding_mask"] > 0
    checks.assert_close(got[mask], want[mask], "gather with room for every token vs dropless")


def _dense_qwen3():
    return keras_hub.models.Qwen3Backbone(
        vocabulary_size=32,
        num_layers=1,
        num_query_heads=2,
        num_key_value_heads=1,
        hidden_dim=8,
        intermediate_dim=16,
        head_dim=4,
    )


@pytest.mark.parametrize(
    "make, message",
    [
        (_dense_qwen3, "supported family"),
        (lambda: keras.Sequential([keras.layers.Dense(2)]), "keras-hub Backbone or CausalLM"),
        (
            lambda: keras_moe.sparsify(
                keras_hub.models.MixtralBackbone(
                    vocabulary_size=32,
                    num_layers=1,
                    num_query_heads=2,
                    num_key_value_heads=1,
                    hidden_dim=8,
                    intermediate_dim=16,
                    num_experts=4,
                    top_k=2,
                )
            ),
            "already sparse",
        ),
    ],
)
def test_what_cannot_be_sparsified_is_refused_naming_it(make, message):
    with pytest.raises(ValueError, match=message):
        keras_moe.sparsify(make())


@pytest.mark.parametrize("family", ["Gemma4", "Qwen3_5Moe"])
def test_keras_hub_moe_families_that_do_not_map_are_refused_naming_the_family(family):
    # Only the class matters to the refusal: an instance without building one.
    cls = type(f"{family}Backbone", (keras_hub.models.Backbone,), {})
    with pytest.raises(ValueError, match=f"keras-hub's {family} family"):
        keras_moe.sparsify(cls.__new__(cls))


def test_loss_free_balancing_moves_the_bias_in_training_only(folders):
    model = checks.load(folders["Mixtral"], bias_update_rate=1e-3)
    routers = [layer._sparse_moe_block.moe.router for layer in model.backbone.transformer_layers]
    model(checks.batch())
    assert all(not np.any(keras.ops.convert_to_numpy(r.expert_bias)) for r in routers)
    model(checks.batch(), training=True)
    for router in routers:  # each expert moved by one step, up or down
        bias = keras.ops.convert_to_numpy(router.expert_bias)
        np.testing.assert_allclose(np.abs(bias[bias != 0]), 1e-3, rtol=1e-6)
        assert np.count_nonzero(bias) >= router.num_experts // 2, bias


@pytest.mark.parametrize(
    "option, value",
    [
        ("dispatch", "fast"),
        ("aux_loss_factor", -1),
        ("bias_update_rate", "x"),
        ("train_capacity_factor", 0),
    ],
)
def test_bad_options_are_refused_before_loading(option, value):
    with pytest.raises(ValueError, match=f"`{option}`"):
        keras_moe.from_preset("/no/such/folder", **{option: value})
