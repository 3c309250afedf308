"""In-process training: loss falls, resume == an uninterrupted run, Mirrored == single device."""

import functools
import os

import keras
import numpy as np
import pytest

from keras_moe import SwitchFeedForward
from tests.training.helpers import parse


def _train(model_dir, bindings=()):
    from keras_moe.training import train_configurables

    parse(list(bindings))
    return train_configurables.train(
        str(model_dir),
        write_config=train_configurables.write_operative_config,
        tensorboard=False,
        verbose=0,
    )


@pytest.mark.slow
def test_a_few_steps_lower_the_loss_on_the_embedded_data(tmp_path):
    keras.utils.set_random_seed(0)
    summary = _train(tmp_path, ["TRAIN_STEPS = 40", "CheckpointConfig.every = 20"])
    # Loss of the same held-out batches before and after training (model.evaluate).
    start, end = summary["eval_start"]["loss"], summary["eval_end"]["loss"]
    assert np.isfinite(start) and end < start - 0.5, (start, end)
    # The uniform-prediction loss is log(vocab): an untrained model starts near it.
    assert abs(start - np.log(8100)) < 1.5
    assert summary["end_step"] == 40
    for name in ("operative_config.gin", "expert_load.png", "expert_load.json", "summary.json"):
        assert os.path.isfile(tmp_path / name), name
    text = open(tmp_path / "operative_config.gin").read()
    assert "BATCH_SIZE = 8" in text and "T5Config.d_model = 32" in text
    ckpts = sorted(os.listdir(tmp_path / "checkpoints"))
    assert "ckpt-00000040.weights.h5" in ckpts and "ckpt-00000020.json" in ckpts


def _final_weights(model_dir):
    from keras_moe.training import checkpoint as ckpt_lib
    from keras_moe.training import train_configurables, trainer

    meta = ckpt_lib.CheckpointManager(os.path.join(model_dir, "checkpoints")).latest()
    model = trainer.build_compiled_model(optimizer=train_configurables.make_optimizer)
    ckpt_lib.restore(model, meta)
    return (
        int(model.optimizer.iterations.numpy()),
        [v.numpy() for v in model.weights],
        [v.numpy() for v in model.optimizer.variables],
    )


@pytest.mark.slow
def test_resume_continues_exactly_like_an_uninterrupted_run(tmp_path):
    """The uninterrupted run's folder without its last checkpoint is where a run that
    died after step 6 stands: the same command resumes it and ends on the same weights."""
    import shutil

    from keras_moe.training import checkpoint as ckpt_lib

    # SGD: Adam's m/sqrt(v) turns float round-off of near-zero gradients into
    # lr-sized steps, which would hide nothing but makes exact comparison noisy.
    common = [
        "CheckpointConfig.every = 6",
        "train.summary_batches = 0",
        "make_optimizer.name = 'sgd'",
        "make_optimizer.learning_rate = 0.5",
        "TRAIN_STEPS = 12",
    ]
    keras.utils.set_random_seed(1)
    _train(tmp_path / "straight", common)
    shutil.copytree(tmp_path / "straight", tmp_path / "resumed")
    manager = ckpt_lib.CheckpointManager(str(tmp_path / "resumed" / "checkpoints"))
    for path in (manager.weights_path(12), manager.meta_path(12)):
        os.remove(path)
    assert manager.latest()["step"] == 6
    keras.utils.set_random_seed(99)  # The restored run must not depend on the init seed.
    second = _train(tmp_path / "resumed", common)
    assert second["start_step"] == 6 and second["end_step"] == 12
    assert second["resumed_from"].endswith("ckpt-00000006.weights.h5")
    step_a, weights_a, opt_a = _final_weights(tmp_path / "straight")
    step_b, weights_b, opt_b = _final_weights(tmp_path / "resumed")
    assert step_a == step_b == 12
    for a, b in zip(weights_a + opt_a, weights_b + opt_b, strict=False):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


def test_skip_reproduces_the_data_position():
    from keras_moe.training.run import input_pipeline

    lengths = {"inputs": 64, "targets": 14}
    stream = input_pipeline.make_dataset("embedded_span_corruption", lengths, "train", 4, seed=3)
    reference = [b[0]["encoder_input_tokens"].numpy() for b in stream.take(5)]
    skipped = input_pipeline.make_dataset(
        "embedded_span_corruption", lengths, "train", 4, seed=3, skip_batches=3
    )
    got = [b[0]["encoder_input_tokens"].numpy() for b in skipped.take(2)]
    np.testing.assert_array_equal(got[0], reference[3])
    np.testing.assert_array_equal(got[1], reference[4])
    assert not np.array_equal(reference[0], reference[1])


def _fixed_batches(num, batch, seed=0):
    """Unpadded synthetic batches: every replica sees the same number of loss tokens."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(num):
        x = {
            "encoder_input_tokens": rng.integers(2, 60, (batch, 12)).astype("int32"),
            "decoder_input_tokens": rng.integers(2, 60, (batch, 6)).astype("int32"),
        }
        x["decoder_input_tokens"][:, 0] = 0
        y = rng.integers(2, 60, (batch, 6)).astype("int32")
        out.append((x, y, np.ones((batch, 6), "float32")))
    return out


def _padded_batches(num, batch, seed=0):
    """Batches whose first half keeps 1 of 6 target tokens and second half all 6:
    under two replicas, one replica holds 4 loss tokens and the other 24."""
    out = []
    for x, y, w in _fixed_batches(num, batch, seed):
        w = w.copy()
        w[: batch // 2, 1:] = 0.0
        out.append((x, y, w))
    return out


def _tiny_switch(strategy, init_weights, z_loss_factor=0.01, dispatch="auto"):
    """A compiled 2+2-layer Switch T5 built under `strategy`, with `init_weights` if given."""
    from keras_moe.models import T5Config, build_model

    config = T5Config(
        vocab_size=64,
        d_model=16,
        num_heads=2,
        d_kv=8,
        d_ff=32,
        num_encoder_layers=2,
        num_decoder_layers=2,
        encoder_sparse_step=2,
        decoder_sparse_step=2,
        sparse_ffn=functools.partial(
            SwitchFeedForward,
            num_experts=4,
            d_ff=32,
            activation="gated-gelu",
            aux_loss_factor=0.1,
            z_loss_factor=z_loss_factor,
            min_expert_capacity=1,
            train_capacity_factor=1.0,
            group_size="sequence",
            dispatch=dispatch,
        ),
    )
    with strategy.scope():
        model = build_model(config)
        model.compile(**model.compile_defaults(optimizer=keras.optimizers.SGD(0.5)))
    if init_weights is not None:
        model.set_weights(init_weights)
    return model


def _loss_trajectory(strategy, init_weights, batches, z_loss_factor=0.01, dispatch="auto"):
    import tensorflow as tf

    model = _tiny_switch(strategy, init_weights, z_loss_factor, dispatch)
    weights = model.get_weights()
    losses = []
    for x, y, w in batches:
        ds = tf.data.Dataset.from_tensors((x, y, w))
        history = model.fit(ds, epochs=1, verbose=0)
        losses.append(history.history["loss"][0])
    model(batches[0][0], training=True)
    aux = [float(loss) for loss in model.losses]
    return weights, np.array(losses), aux, [v.numpy() for v in model.weights]


@pytest.mark.slow
@pytest.mark.parametrize("dispatch", ["auto", "dropless"])
def test_mirrored_two_cpus_matches_one_device(two_cpu_strategy, dispatch):
    import tensorflow as tf

    batches = _fixed_batches(4, batch=8)
    keras.utils.set_random_seed(0)
    init, single, aux, w_single = _loss_trajectory(
        tf.distribute.get_strategy(), None, batches, dispatch=dispatch
    )
    assert len(aux) == 4 and all(a > 0 for a in aux)  # 2 MoE layers x (aux, z) in the loss.
    mirrored = two_cpu_strategy
    assert mirrored.num_replicas_in_sync == 2
    _, double, _, w_double = _loss_trajectory(mirrored, init, batches, dispatch=dispatch)
    np.testing.assert_allclose(double, single, rtol=1e-5, atol=1e-6)
    assert single[-1] < single[0]
    for a, b in zip(w_single, w_double, strict=False):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


@pytest.mark.slow
def test_mirrored_normalises_by_the_global_token_count(two_cpu_strategy):
    """Replicas with different numbers of loss tokens: the loss is the global
    token mean, as on one device (a mean of per-replica means was 3.5 % off
    here). The z-loss is a mean over each replica's own tokens, so it is off."""
    import tensorflow as tf

    batches = _padded_batches(3, batch=8)
    keras.utils.set_random_seed(0)
    init, single, _, w_single = _loss_trajectory(
        tf.distribute.get_strategy(), None, batches, z_loss_factor=0.0
    )
    _, double, _, w_double = _loss_trajectory(two_cpu_strategy, init, batches, z_loss_factor=0.0)
    np.testing.assert_allclose(double, single, rtol=1e-5, atol=1e-6)
    for a, b in zip(w_single, w_double, strict=False):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


@pytest.mark.slow
def test_mirrored_fit_trains_on_the_first_pass_of_a_reshuffling_dataset(two_cpu_strategy):
    """A seeded shuffle redraws its order on every pass (seqio's does). Keras
    3.15 read one batch of a distributed fit's dataset and restarted it, so
    replicas trained on the second pass's order: other batches than one device."""
    import tensorflow as tf

    batches = _fixed_batches(4, batch=8)
    stacked = tuple(
        np.stack([b[i] for b in batches])
        if i
        else {k: np.stack([b[0][k] for b in batches]) for k in batches[0][0]}
        for i in range(3)
    )
    ds = tf.data.Dataset.from_tensor_slices(stacked).shuffle(4, seed=7)
    passes = [[int(x["encoder_input_tokens"][0, 0]) for x, _, _ in ds] for _ in range(2)]
    assert passes[0] != passes[1]
    losses, weights = [], []
    init = None
    for strategy in (tf.distribute.get_strategy(), two_cpu_strategy):
        keras.utils.set_random_seed(0)
        model = _tiny_switch(strategy, init)
        init = model.get_weights()
        fresh = tf.data.Dataset.from_tensor_slices(stacked).shuffle(4, seed=7)
        losses.append(
            model.fit(fresh, epochs=1, steps_per_epoch=2, verbose=0, shuffle=False).history["loss"][
                0
            ]
        )
        weights.append([v.numpy() for v in model.weights])
    np.testing.assert_allclose(losses[1], losses[0], rtol=1e-5)
    for a, b in zip(*weights, strict=False):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


@pytest.mark.e2e
def test_empty_dataset_and_unknown_task_fail_before_writing(tmp_path):
    import seqio
    import tensorflow as tf

    from keras_moe import tasks
    from keras_moe.training.errors import TrainingConfigError

    name = "keras_moe_test_empty_task"
    if name in seqio.TaskRegistry.names():
        seqio.TaskRegistry.remove(name)
    seqio.TaskRegistry.add(
        name,
        source=seqio.FunctionDataSource(
            lambda split, shuffle_files, seed=None: tf.data.Dataset.from_tensor_slices(
                {"inputs": tf.constant([], tf.string), "targets": tf.constant([], tf.string)}
            ),
            splits=["train", "validation"],
        ),
        preprocessors=[seqio.preprocessors.tokenize, seqio.preprocessors.append_eos],
        output_features=tasks.output_features(),
    )
    with pytest.raises(TrainingConfigError, match="produced no batch"):
        _train(tmp_path / "empty", [f'MIXTURE_OR_TASK_NAME = "{name}"'])
    assert os.listdir(tmp_path / "empty") == []
    with pytest.raises(TrainingConfigError, match="embedded_span_corruptoin.*close names"):
        _train(tmp_path / "typo", ['MIXTURE_OR_TASK_NAME = "embedded_span_corruptoin"'])
    assert os.listdir(tmp_path / "typo") == []
    with pytest.raises(TrainingConfigError, match="batch_size"):
        _train(tmp_path / "type", ['BATCH_SIZE = "eight"'])
    seqio.TaskRegistry.remove(name)
