"""`train` gets its collaborators injected (data, checkpoints, placement); the flat
settings of earlier run files still build them, and a mix of both is refused
naming the binding that replaced the flat one."""

import pytest

import gin
from keras_moe.gin_config import parse_gin
from keras_moe.training import train_configurables
from keras_moe.training.checkpoint.checkpoint_config import CheckpointConfig
from keras_moe.training.errors import TrainingConfigError, WorkerFailureError
from keras_moe.training.placement import MeshPlacement, StrategyPlacement
from keras_moe.training.run.dataset_config import DatasetConfig
from keras_moe.training.train_config import SHORTHANDS, TrainConfig

# An operative_config.gin of a run trained before the collaborators existed:
# every flat setting, as gin wrote them.
OLD_OPERATIVE_TRAIN = """
train.backup_every = 7
train.batch_size = 6
train.checkpoint_every = 20
train.cluster_wait_timeout = 600
train.collective_timeout = 600
train.feature_lengths = {'inputs': 32, 'targets': 8}
train.init_checkpoint = None
train.input_shards = None
train.keep_checkpoints = 2
train.logical_axis_rules = None
train.mesh_shape = None
train.mirrored_devices = None
train.pack = False
train.seed = 3
train.shuffle = True
train.strategy = 'mirrored'
train.task = 'embedded_span_corruption'
train.tpu_name = None
train.train_steps = 40
"""


@pytest.fixture(autouse=True)
def _clean_gin():
    gin.clear_config()
    yield
    gin.clear_config()


def test_the_shipped_run_files_inject_the_collaborators():
    parse_gin("tiny_local.gin", check_unread=False)
    config = train_configurables.job_config()
    assert config.dataset == DatasetConfig(
        task="embedded_span_corruption",
        feature_lengths={"inputs": 128, "targets": 29},
        batch_size=16,
    )
    assert config.checkpoint == CheckpointConfig(every=100, keep=2)
    assert config.placement is None and config.train_steps == 300
    gin.clear_config()
    parse_gin("pretrain_c4_mesh.gin", check_unread=False)
    placement = train_configurables.job_config().placement
    assert isinstance(placement, MeshPlacement)
    assert placement.mesh_shape == {"data": 1, "expert": 8, "model": 1}
    gin.clear_config()
    parse_gin("pretrain_c4.gin", check_unread=False)
    placement = train_configurables.job_config().placement
    assert isinstance(placement, StrategyPlacement)
    assert (placement.name, placement.tpu_name) == ("tpu", "local")


def test_an_old_operative_config_builds_the_same_collaborators():
    import keras_moe.training.train_configurables  # noqa: F401  (registers train)

    gin.parse_config(OLD_OPERATIVE_TRAIN)
    config = train_configurables.job_config().check()
    assert config.dataset == DatasetConfig(
        task="embedded_span_corruption",
        feature_lengths={"inputs": 32, "targets": 8},
        batch_size=6,
        pack=False,
        shuffle=True,
        seed=3,
    )
    assert config.checkpoint == CheckpointConfig(every=20, keep=2, backup_every=7)
    assert isinstance(config.placement, StrategyPlacement)
    assert config.placement.name == "mirrored" and config.steps_per_epoch == 20


def test_a_flat_setting_beside_its_collaborator_is_refused_naming_the_new_binding():
    parse_gin(
        "tiny_local.gin", ["train.batch_size = 8", "train.keep_checkpoints = 1"], check_unread=False
    )
    with pytest.raises(TrainingConfigError) as error:
        train_configurables.job_config()
    message = str(error.value)
    assert "train.batch_size is DatasetConfig.batch_size now" in message
    assert "bind DatasetConfig.batch_size instead" in message


def test_the_mesh_shorthand_works_where_no_placement_is_bound_and_is_refused_beside_one():
    parse_gin("tiny_local.gin", ['train.mesh_shape = {"data": 2, "expert": 4}'], check_unread=False)
    placement = train_configurables.job_config().placement
    assert isinstance(placement, MeshPlacement)
    assert placement.mesh_shape == {"data": 2, "expert": 4}
    gin.clear_config()
    parse_gin(
        "pretrain_c4_mesh.gin", ['train.mesh_shape = {"data": 2, "expert": 4}'], check_unread=False
    )
    with pytest.raises(TrainingConfigError, match=r"bind MeshPlacement.mesh_shape instead"):
        train_configurables.job_config()


@pytest.mark.parametrize(
    "settings,message",
    [
        (dict(batchsize=8), r"train has no setting batchsize; its settings are"),
        (dict(mesh_shape={"data": 2}, strategy="mirrored"), r"bind one placement"),
        (dict(logical_axis_rules=(("batch", "data"),)), r"MeshPlacement.mesh_shape"),
        (dict(placement="mirrored"), r"train.placement must be @StrategyPlacement\(\) or"),
        (dict(batch_size=0), r"`DatasetConfig.batch_size` must be an integer >= 1, got 0"),
        (dict(checkpoint_every=0), r"`CheckpointConfig.every` must be an integer >= 1"),
        (dict(strategy="mirrord"), r"StrategyPlacement.strategy must be one of"),
        (dict(collective_timeout=-1), r"`StrategyPlacement.collective_timeout` must be a positive"),
        (dict(feature_lengths={"inputs": 8}), r"TASK_FEATURE_LENGTHS must be a dict"),
        (dict(train_steps=0), r"`train.train_steps` must be an integer >= 1"),
        (dict(eval_routing="batch"), r"train.eval_routing must be one of \('groups', 'sequence'\)"),
    ],
)
def test_bad_settings_are_refused_naming_the_setting(settings, message):
    with pytest.raises(TrainingConfigError, match=message):
        TrainConfig.from_settings(**settings).check()


def test_every_old_flat_setting_has_a_home():
    """The fields TrainConfig had before the collaborators: each is a field or a shorthand."""
    import dataclasses

    old = (
        "task feature_lengths batch_size train_steps steps_per_epoch checkpoint_every "
        "keep_checkpoints backup_every log_every pack shuffle seed strategy tpu_name "
        "mirrored_devices optimizer jit_compile steps_per_execution init_checkpoint "
        "eval_split summary_batches validation_freq expert_load_every tensorboard verbose "
        "write_config collective_timeout cluster_wait_timeout record_batches model "
        "mesh_shape logical_axis_rules input_shards dtype_policy"
    ).split()
    fields = {f.name for f in dataclasses.fields(TrainConfig)}
    assert not [name for name in old if name not in fields and name not in SHORTHANDS]
    assert len(fields) <= 20


def test_a_failed_collective_names_the_resume_only_under_multi_worker():
    import tensorflow as tf

    error = tf.errors.UnavailableError(None, None, "peer down\nmore")
    failure = StrategyPlacement("multi_worker", collective_timeout=30).peer_failure(error, 12)
    assert isinstance(failure, WorkerFailureError)
    assert "at step 12 (UnavailableError: peer down)" in str(failure)
    assert "collective_timeout=30 s" in str(failure)
    assert StrategyPlacement().peer_failure(error, 12) is None
    assert StrategyPlacement("multi_worker").peer_failure(ValueError("x"), 1) is None
    assert MeshPlacement({"data": 2}).peer_failure(error, 12) is None


def test_eval_routing_reaches_the_model_or_is_refused_where_it_cannot():
    import keras

    from keras_moe.models import EncoderDecoder, T5Config
    from keras_moe.training.run.training_run import set_eval_routing

    model = EncoderDecoder(
        T5Config(
            vocab_size=16,
            d_model=8,
            num_heads=2,
            d_kv=4,
            d_ff=8,
            num_encoder_layers=1,
            num_decoder_layers=1,
        )
    )
    set_eval_routing(model, "sequence")
    assert model.eval_routing == "sequence"
    plain = keras.Sequential([keras.layers.Dense(1)])
    set_eval_routing(plain, "groups")  # what it does anyway
    with pytest.raises(
        TrainingConfigError,
        match=r"train.eval_routing='sequence' needs a "
        r"keras_moe EncoderDecoder; Sequential",
    ):
        set_eval_routing(plain, "sequence")
