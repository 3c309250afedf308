"""A sparse run started from a dense checkpoint (`CheckpointConfig.upcycle`).

The reference is the dense model itself: restored from the same checkpoint and
trained one more step on the same batch, its non-MoE weights must move exactly
as the upcycled model's do, which holds only when the optimizer state and the
step came over with the weights.
"""

import dataclasses

import keras
import numpy as np
import pytest

from keras_moe import TopKFeedForward
from keras_moe.models import EncoderDecoder, T5Config
from keras_moe.models.variable_paths import relative_paths
from keras_moe.training.checkpoint.checkpoint_config import CheckpointConfig
from keras_moe.training.checkpoint.upcycle_checkpoint import Upcycle
from keras_moe.training.errors import TrainingConfigError
from keras_moe.training.run.schedules import make_optimizer

DENSE = T5Config(
    vocab_size=40,
    d_model=16,
    num_heads=2,
    d_kv=8,
    d_ff=32,
    num_encoder_layers=2,
    num_decoder_layers=2,
    activation="gated-gelu",
)


def _sparse_config(d_ff=32, k=1, num_experts=4):
    # No balance or z loss and no dropping, so that only the experts' own updates differ.
    return dataclasses.replace(
        DENSE,
        encoder_sparse_step=2,
        decoder_sparse_step=2,
        sparse_ffn=TopKFeedForward(
            num_experts=num_experts,
            d_ff=d_ff,
            k=k,
            normalize_top_k=True,
            train_capacity_factor=8.0,
            eval_capacity_factor=8.0,
            aux_loss_factor=0.0,
            z_loss_factor=0.0,
            activation="gated-gelu",
        ),
    )


def _batch(seed):
    rng = np.random.default_rng(seed)
    x = {
        "encoder_input_tokens": rng.integers(2, 40, (4, 10)).astype("int32"),
        "decoder_input_tokens": rng.integers(2, 40, (4, 7)).astype("int32"),
    }
    return x, rng.integers(2, 40, (4, 7)).astype("int32"), np.ones((4, 7), "float32")


def _compiled(config, name="adafactor"):
    model = EncoderDecoder(config)
    optimizer = make_optimizer(name=name, learning_rate=0.01, schedule="constant")
    model.compile(**model.compile_defaults(optimizer=optimizer, jit_compile=False))
    return model


@pytest.fixture(scope="module")
def dense_checkpoint(tmp_path_factory):
    """A dense model trained 3 steps with Adafactor, saved with its optimizer state."""
    keras.utils.set_random_seed(0)
    dense = _compiled(DENSE)
    for step in range(3):
        dense.train_on_batch(*_batch(step))
    path = str(tmp_path_factory.mktemp("dense") / "ckpt.weights.h5")
    dense.save_weights(path)
    return path


def _upcycled(path, tmp_path, config=None, upcycle=None, name="adafactor"):
    keras.utils.set_random_seed(1)
    sparse = _compiled(config or _sparse_config(), name)
    checkpoints = CheckpointConfig(init_checkpoint=path, upcycle=upcycle or Upcycle()).check()
    _, _, resumed, start_step = checkpoints.restore(sparse, str(tmp_path / "run"))
    assert resumed is None
    return sparse, start_step


@pytest.mark.slow  # whole models compiled and trained: in CI, not the fast tier
def test_the_upcycled_run_continues_the_dense_run_step_for_step(dense_checkpoint, tmp_path):
    sparse, start_step = _upcycled(dense_checkpoint, tmp_path)
    dense = _compiled(DENSE)
    dense.optimizer.build(dense.trainable_variables)
    dense.load_weights(dense_checkpoint)
    assert start_step == 3 == int(sparse.optimizer.iterations.numpy())

    batch = _batch(7)
    np.testing.assert_allclose(
        sparse.predict_on_batch(batch[0]), dense.predict_on_batch(batch[0]), atol=2e-5
    )
    sparse_loss = sparse.train_on_batch(*batch)
    dense_loss = dense.train_on_batch(*batch)
    np.testing.assert_allclose(sparse_loss, dense_loss, rtol=1e-5)
    ours, theirs = relative_paths(sparse), relative_paths(dense)
    shared = [p for p in theirs if p in ours]
    assert len(shared) > 30
    for path in shared:
        np.testing.assert_allclose(
            ours[path].numpy(), theirs[path].numpy(), atol=1e-6, err_msg=path
        )


@pytest.mark.slow  # whole models compiled and trained: in CI, not the fast tier
def test_without_the_optimizer_state_the_first_step_differs(dense_checkpoint, tmp_path):
    # The check above can fail: an optimizer started afresh moves the weights otherwise.
    sparse, start_step = _upcycled(
        dense_checkpoint, tmp_path, upcycle=Upcycle(optimizer_state=False)
    )
    dense = _compiled(DENSE)
    dense.optimizer.build(dense.trainable_variables)
    dense.load_weights(dense_checkpoint)
    assert start_step == 0
    batch = _batch(7)
    sparse.train_on_batch(*batch)
    dense.train_on_batch(*batch)
    path = "encoder_layer_0/attention/query"
    assert (
        np.abs(relative_paths(sparse)[path].numpy() - relative_paths(dense)[path].numpy()).max()
        > 1e-4
    )


@pytest.mark.slow  # whole models compiled and trained: in CI, not the fast tier
def test_granular_experts_take_their_slice_of_the_adafactor_moments(dense_checkpoint, tmp_path):
    sparse, _ = _upcycled(dense_checkpoint, tmp_path, _sparse_config(d_ff=8, k=4, num_experts=8))
    dense = _compiled(DENSE)
    dense.optimizer.build(dense.trainable_variables)
    dense.load_weights(dense_checkpoint)

    def slots(model, path):
        optimizer = model.optimizer
        variable = relative_paths(model)[path]
        index = optimizer._get_variable_index(variable)
        return [
            np.asarray(s[index].numpy(), np.float64)
            for s in (optimizer._r, optimizer._c, optimizer._v)
        ]

    r, c, v = slots(dense, "encoder_layer_1/ffn/wi_0")  # [16, 32]: r [16], c [32]
    er, ec, ev = slots(sparse, "encoder_layer_1/ffn/experts/wi_0")  # [8, 16, 8]
    for expert, part in ((0, 0), (6, 2)):
        cut = slice(8 * part, 8 * part + 8)
        np.testing.assert_allclose(ec[expert], c[cut], rtol=1e-6)
        np.testing.assert_allclose(er[expert], r * c[cut].mean() / c.mean(), rtol=1e-5)
        np.testing.assert_allclose(ev[expert], v[:, cut], rtol=1e-6)
    r, c, _ = slots(dense, "decoder_layer_1/ffn/wo")  # [32, 16]: r [32], c [16]
    er, ec, _ = slots(sparse, "decoder_layer_1/ffn/experts/wo")  # [8, 8, 16]
    np.testing.assert_allclose(er[5], r[8:16], rtol=1e-6)
    np.testing.assert_allclose(ec[5], c * r[8:16].mean() / r.mean(), rtol=1e-5)
    router = relative_paths(sparse)["encoder_layer_1/ffn/router/kernel"]
    index = sparse.optimizer._get_variable_index(router)
    assert not sparse.optimizer._r[index].numpy().any()


@pytest.mark.slow  # whole models compiled and trained: in CI, not the fast tier
def test_an_adam_run_carries_its_moments(tmp_path):
    keras.utils.set_random_seed(0)
    dense = _compiled(DENSE, "adam")
    dense.train_on_batch(*_batch(0))
    path = str(tmp_path / "adam.weights.h5")
    dense.save_weights(path)
    sparse, start_step = _upcycled(path, tmp_path, name="adam")
    assert start_step == 1
    optimizer = sparse.optimizer
    expert = relative_paths(sparse)["decoder_layer_1/ffn/experts/wi_1"]
    momentum = optimizer._momentums[optimizer._get_variable_index(expert)].numpy()
    source = relative_paths(dense)["decoder_layer_1/ffn/wi_1"]
    want = dense.optimizer._momentums[dense.optimizer._get_variable_index(source)].numpy()
    assert np.abs(want).max() > 0
    for e in range(4):
        np.testing.assert_array_equal(momentum[e], want)


@pytest.mark.slow  # whole models compiled and trained: in CI, not the fast tier
def test_a_checkpoint_of_another_optimizer_or_shape_is_refused(dense_checkpoint, tmp_path):
    with pytest.raises(TrainingConfigError, match="does not hold this run's optimizer state"):
        _upcycled(dense_checkpoint, tmp_path / "adam", name="adam")
    wide = dataclasses.replace(_sparse_config(), d_model=24)
    with pytest.raises(
        TrainingConfigError, match="is not the dense form of the configured sparse model"
    ):
        _upcycled(dense_checkpoint, tmp_path / "wide", wide)


@pytest.mark.parametrize(
    "settings, match",
    [
        ({"upcycle": Upcycle()}, "CheckpointConfig.upcycle needs the dense checkpoint"),
        ({"init_checkpoint": "x", "upcycle": "yes"}, "CheckpointConfig.upcycle must be an Upcycle"),
        (
            {"init_checkpoint": "x", "upcycle": Upcycle(noise_std=-1)},
            "`Upcycle.noise_std` must be a number >= 0, got -1",
        ),
        (
            {"init_checkpoint": "x", "upcycle": Upcycle(optimizer_state="no")},
            "`Upcycle.optimizer_state` must be True or False",
        ),
    ],
)
def test_bad_upcycle_settings_are_refused_naming_them(settings, match):
    with pytest.raises(TrainingConfigError, match=match):
        CheckpointConfig(**settings).check()


@pytest.mark.parametrize(
    "dispatch,capacity,exact",
    [
        ("dropless", 1.0, True),  # no capacity: the first step is the dense model's
        ("gather", 8.0, True),  # a capacity no expert exceeds: the same
        ("gather", 0.5, False),  # tokens over capacity get 0 from the MoE branch
    ],
)
def test_the_upcycled_start_is_measured_on_a_batch_and_logged(
    dense_checkpoint, tmp_path, capsys, dispatch, capacity, exact
):
    x, _, _ = _batch(9)
    config = dataclasses.replace(
        _sparse_config(),
        sparse_ffn=TopKFeedForward(
            num_experts=4,
            d_ff=32,
            k=1,
            normalize_top_k=True,
            dispatch=dispatch,
            train_capacity_factor=capacity,
            eval_capacity_factor=capacity,
            min_expert_capacity=0,
            activation="gated-gelu",
        ),
    )
    keras.utils.set_random_seed(1)
    sparse = _compiled(config)
    checkpoints = CheckpointConfig(init_checkpoint=dense_checkpoint, upcycle=Upcycle()).check()
    checkpoints.restore(sparse, str(tmp_path / "run"), probe=lambda: x)
    out = capsys.readouterr().out
    dense = _compiled(DENSE)
    dense.load_weights(dense_checkpoint)
    gap = np.abs(np.asarray(sparse(x, training=True)) - np.asarray(dense(x, training=True))).max()
    if exact:
        assert gap < 1e-4, gap
        assert "upcycled start: the first batch's logits are the dense model's" in out, out
    else:
        assert gap > 0.05, gap
        assert "warning: upcycled start: the first batch's logits differ" in out, out
        assert f"by up to {gap:.2g} (training mode)" in out and 'dispatch="dropless"' in out
