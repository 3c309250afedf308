"""Schedules, checkpoint files, fit segments, gin lookup and errors (no training)."""

import json
import math
import os

import numpy as np
import pytest

from keras_moe import gin_config
from keras_moe.gin_config import GinConfigError
from keras_moe.training import checkpoint as ckpt_lib
from keras_moe.training import trainer
from keras_moe.training.errors import TrainingConfigError
from keras_moe.training.run import training_run
from keras_moe.training.run.schedules import InverseSqrtSchedule, make_optimizer


def test_inverse_sqrt_schedule_matches_t5_formula():
    schedule = InverseSqrtSchedule(scale=1.0, warmup_steps=10000)
    for step in (0, 1, 5000, 10000, 40000, 1000000):
        expected = 1.0 / math.sqrt(max(step, 10000))
        assert float(schedule(step)) == pytest.approx(expected, rel=1e-6)
        assert schedule.value(step) == pytest.approx(expected, rel=1e-12)
    capped = InverseSqrtSchedule(2.0, 100, max_learning_rate=0.05)
    assert float(capped(400)) == pytest.approx(0.05)
    assert float(capped(6400)) == pytest.approx(2.0 / 80)
    with pytest.raises(TrainingConfigError, match="warmup_steps"):
        InverseSqrtSchedule(1.0, 0)


def test_make_optimizer_kinds_and_errors():
    assert type(make_optimizer()).__name__ == "Adafactor"
    adam = make_optimizer("adam", learning_rate=1e-3, schedule="constant")
    assert type(adam).__name__ == "Adam"
    assert float(np.asarray(adam.learning_rate)) == pytest.approx(1e-3)
    with pytest.raises(TrainingConfigError, match="make_optimizer.name"):
        make_optimizer("rmsprop")
    with pytest.raises(TrainingConfigError, match="learning_rate"):
        make_optimizer("adam", learning_rate="fast")


@pytest.mark.parametrize(
    "start,total,spe,expected",
    [
        (0, 30, 10, [(0, 3, 10, 0)]),
        (15, 30, 10, [(1, 2, 5, 15), (2, 3, 10, 20)]),
        (0, 25, 10, [(0, 2, 10, 0), (2, 3, 5, 20)]),
        (30, 30, 10, []),
    ],
)
def test_fit_segments_cover_exactly_the_remaining_steps(start, total, spe, expected):
    segments = training_run.fit_segments(start, total, spe)
    assert segments == expected
    steps = sum((epochs - initial) * n for initial, epochs, n, _ in segments)
    assert steps == total - start


class _FakeModel:
    """save_weights/load_weights stand-in: writes a small file."""

    def __init__(self, fail=False):
        self.fail = fail

    def save_weights(self, path, overwrite=True):
        if self.fail:
            with open(path, "w") as f:
                f.write("partial")
            raise OSError("disk full")
        with open(path, "w") as f:
            f.write("weights")


def test_checkpoint_retention_and_latest(tmp_path):
    manager = ckpt_lib.CheckpointManager(str(tmp_path), keep=2)
    for step in (10, 20, 30):
        manager.save(_FakeModel(), step)
    assert [m["step"] for m in manager.all()] == [20, 30]
    assert manager.latest()["step"] == 30
    assert sorted(os.listdir(tmp_path)) == [
        "checkpoint",
        "ckpt-00000020.json",
        "ckpt-00000020.weights.h5",
        "ckpt-00000030.json",
        "ckpt-00000030.weights.h5",
    ]
    assert json.load(open(tmp_path / "checkpoint"))["latest"] == "ckpt-00000030.json"


def test_a_failed_save_keeps_the_last_good_checkpoint(tmp_path):
    manager = ckpt_lib.CheckpointManager(str(tmp_path), keep=1)
    manager.save(_FakeModel(), 10)
    with pytest.raises(OSError):
        manager.save(_FakeModel(fail=True), 20)
    assert manager.latest()["step"] == 10
    assert open(manager.latest()["path"]).read() == "weights"
    # A crash between the weights and the json: weights without metadata are not a checkpoint.
    open(manager.weights_path(30), "w").write("weights")
    assert manager.latest()["step"] == 10
    manager.save(_FakeModel(), 40)  # Cleans the orphan up.
    assert not os.path.exists(manager.weights_path(30))
    assert [m["step"] for m in manager.all()] == [40]


def test_gin_files_resolve_by_name():
    from tests.training.helpers import REPO

    path = gin_config.resolve("tiny_local.gin")
    assert os.path.realpath(path) == os.path.join(REPO, "gin", "runs", "tiny_local.gin")
    assert gin_config.resolve("runs/tiny_local") == path
    assert gin_config.resolve("switch_tiny").endswith("switch_tiny.gin")
    with pytest.raises(GinConfigError, match="no_such_run.gin"):
        gin_config.resolve("no_such_run.gin")


@pytest.mark.parametrize(
    "binding,message",
    [
        ("BATCH_SIZ = 4", "macro 'BATCH_SIZ' is not defined"),
        ("train.no_such_arg = 4", "no_such_arg"),
        ("no_such_configurable.x = 1", "no_such_configurable"),
        ("BATCH_SIZE 4", "NAME = VALUE"),
        ("CHECKPOINT_EVERY = 5", r"CHECKPOINT_EVERY is no longer a macro.*CheckpointConfig\.every"),
        ("LEARNING_RATE = 0.1", r"bind make_optimizer\.learning_rate instead"),
    ],
)
def test_bad_gin_bindings_are_named(binding, message):
    import gin

    gin.clear_config()
    with pytest.raises(GinConfigError, match=message):
        gin_config.parse_gin(["tiny_local.gin"], [binding])
    gin.clear_config()


def test_a_run_file_setting_a_retired_macro_is_refused(tmp_path):
    """A file written for the old defaults.gin (`MESH_SHAPE = ...`) would set nothing now."""
    import gin

    run_file = tmp_path / "old_run.gin"
    run_file.write_text("include 'runs/tiny_local.gin'\nMESH_SHAPE = {'data': 2}\n")
    gin.clear_config()
    with pytest.raises(
        GinConfigError, match=r"old_run.gin: MESH_SHAPE .*MeshPlacement\.mesh_shape"
    ):
        gin_config.parse_gin([str(run_file)])
    gin.clear_config()
    gin_config.parse_gin(["tiny_local.gin"], ["CheckpointConfig.every = 7"])
    assert gin.query_parameter("CheckpointConfig.every") == 7
    # A file that defines such a macro and reads it itself is left alone.
    own = tmp_path / "own_macro.gin"
    own.write_text(
        "include 'runs/tiny_local.gin'\nOPTIMIZER = 'sgd'\nmake_optimizer.name = %OPTIMIZER\n"
    )
    gin_config.parse_gin([str(own)], ["OPTIMIZER = 'adam'"])
    assert gin.query_parameter("%OPTIMIZER") == "adam"
    # ... also when a later file (or binding) is the one that reads it.
    defines = tmp_path / "defines.gin"
    defines.write_text("include 'runs/tiny_local.gin'\nOPTIMIZER = 'sgd'\n")
    reads = tmp_path / "reads.gin"
    reads.write_text("make_optimizer.name = %OPTIMIZER\n")
    for files, bindings in (
        ([defines, reads], []),
        ([defines], ["make_optimizer.name = %OPTIMIZER"]),
    ):
        gin_config.parse_gin([str(f) for f in files], bindings)
        assert str(gin.query_parameter("make_optimizer.name")) == "%OPTIMIZER"
        assert gin.query_parameter("%OPTIMIZER") == "sgd"
    gin.clear_config()


def test_parse_gin_takes_one_file_or_a_list(tmp_path):
    import pathlib

    import gin

    def batch_size(files, bindings=()):
        gin.clear_config()
        gin_config.parse_gin(files, bindings)
        return gin.query_parameter("%BATCH_SIZE")

    try:
        assert batch_size("tiny_local.gin") == 16  # one name, not its characters
        assert batch_size(["tiny_local.gin"], "BATCH_SIZE = 4") == 4  # one binding as a str
        assert batch_size(("runs/tiny_local",), ["BATCH_SIZE = 8"]) == 8
        path = pathlib.Path(gin_config.resolve("tiny_local.gin"))
        assert batch_size(path) == 16  # os.PathLike
        own = tmp_path / "mine.gin"
        own.write_text("BATCH_SIZE = 2\n")
        assert batch_size([path, own]) == 2  # a list of paths, applied in order
        for bad in (5, b"tiny_local.gin", {"tiny_local.gin": 1}, ["tiny_local.gin", 5]):
            with pytest.raises(
                GinConfigError,
                match=r"`files` must be a gin file name or path \(str or "
                r"os.PathLike\), or a list of them",
            ):
                gin_config.parse_gin(bad)
    finally:
        gin.clear_config()


def test_all_run_files_parse():
    import gin
    from keras_moe.training import train_configurables

    for name in (
        "tiny_local",
        "pretrain_c4",
        "pretrain_c4_mesh",
        "pretrain_docs",
        "translate_bible_x2en",
        "finetune",
    ):
        gin.clear_config()
        gin_config.parse_gin([name + ".gin"], ['INIT_CHECKPOINT = "/x"'] * (name == "finetune"))
        dataset = train_configurables.job_config().dataset.check()
        assert dataset.task and dataset.batch_size > 0, name
    gin.clear_config()


def test_bad_model_dir(tmp_path):
    a_file = tmp_path / "file"
    a_file.write_text("x")
    with pytest.raises(TrainingConfigError, match="not a folder"):
        trainer.prepare_model_dir(str(a_file))
    with pytest.raises(TrainingConfigError, match="gs://"):
        trainer.prepare_model_dir("gs://bucket/run")
    assert a_file.read_text() == "x"


def test_build_compiled_model_takes_a_model_factory():
    """`train.model` / `build_compiled_model(model=...)` build what the factory
    returns (the distiller's way in), compiled with that model's defaults."""
    import keras

    from keras_moe.models import build_model
    from tests.models.helpers import tiny_config

    made = []

    def factory():
        made.append(build_model(tiny_config(d_model=24)))
        return made[-1]

    model = trainer.build_compiled_model(keras.optimizers.SGD(0.1), model=factory)
    assert model is made[0] and model.config.d_model == 24
    assert isinstance(model.optimizer, keras.optimizers.SGD) and model.compiled
    with pytest.raises(TrainingConfigError, match="cannot build the model"):
        trainer.build_compiled_model(model=lambda: build_model(tiny_config(num_heads=0)))


def test_init_checkpoint_reads_into_the_models_own_factory(tmp_path):
    """A keras_moe `init_checkpoint` loads through the factory the model came
    from (here not gin's build_model), from a model dir's newest checkpoint."""
    import keras

    from keras_moe.models import build_model
    from keras_moe.training.checkpoint.checkpoint_config import load_init_checkpoint
    from tests.models.helpers import tiny_config

    def factory():
        return build_model(tiny_config(d_model=24))

    tokens = {
        "encoder_input_tokens": np.ones((1, 4), "int32"),
        "decoder_input_tokens": np.zeros((1, 4), "int32"),
    }
    keras.utils.set_random_seed(1)
    trained = factory()
    trained(tokens)
    ckpt_lib.CheckpointManager(os.path.join(tmp_path, "checkpoints")).save(trained, step=5)
    keras.utils.set_random_seed(2)
    fresh = factory()
    fresh(tokens)
    load_init_checkpoint(fresh, str(tmp_path), factory)
    for a, b in zip(trained.weights, fresh.weights, strict=True):
        np.testing.assert_array_equal(a.numpy(), b.numpy())


def test_a_required_macro_left_unbound_is_named():
    import gin

    try:
        for files, missing in (
            (["finetune.gin"], "INIT_CHECKPOINT"),
            (["tiny_local.gin", "distill.gin"], "TEACHER_CHECKPOINT"),
            (["switch_tiny.gin", "runs/defaults.gin"], "MIXTURE_OR_TASK_NAME"),
        ):
            gin.clear_config()
            with pytest.raises(GinConfigError, match=rf"require a value for \['{missing}'\]"):
                gin_config.parse_gin(files)
        gin.clear_config()
        gin_config.parse_gin(["finetune.gin"], ['INIT_CHECKPOINT = "/tmp/teacher"'])
        assert gin.query_parameter("%INIT_CHECKPOINT") == "/tmp/teacher"
    finally:
        gin.clear_config()


def test_the_placement_is_a_mesh_or_a_strategy_and_only_process_0_is_chief():
    from keras_moe.training.placement import MeshPlacement, StrategyPlacement
    from keras_moe.training.train_config import TrainConfig

    mesh = TrainConfig.from_settings(mesh_shape={"data": 2, "expert": 4}).placement
    assert isinstance(mesh, MeshPlacement) and mesh.replicas == 1
    assert not mesh.start(process_index=1).chief and mesh.start(process_index=0).chief
    assert mesh.mesh is None  # nothing set before `apply`, which a Run calls before building
    strategy = TrainConfig.from_settings(strategy="default").placement.start()
    assert isinstance(strategy, StrategyPlacement) and strategy.chief
    assert strategy.shard_report(model=None) is None
    assert not StrategyPlacement().start(process_index=1).chief
