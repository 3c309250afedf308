"""A gin binding of the model's configurables that nothing read is refused, naming it
and the model's sparse layer; bindings that a later command reads are not."""

import pytest

import gin
from keras_moe.gin_config import GinConfigError, parse_gin
from keras_moe.gin_config.model_configurables import build_model


@pytest.fixture(autouse=True)
def _clean_gin():
    gin.clear_config()
    yield
    gin.clear_config()


@pytest.mark.parametrize(
    "files,bindings,message",
    [
        # A scoped binding that no `@encoder/SwitchFeedForward` reference calls.
        (
            "switch_tiny.gin",
            ["encoder/SwitchFeedForward.batch_prioritized_routing = True"],
            "`encoder/SwitchFeedForward.batch_prioritized_routing` was bound but the model's "
            "sparse layer is SwitchFeedForward; nothing read it.",
        ),
        # A misspelt scope beside the right reference.
        (
            "switch_tiny.gin",
            [
                "T5Config.encoder_sparse_ffn = @encoder/SwitchFeedForward",
                "encodr/SwitchFeedForward.batch_prioritized_routing = True",
            ],
            "`encodr/SwitchFeedForward.batch_prioritized_routing` was bound but the model's sparse "
            "layer is SwitchFeedForward; nothing read it.",
        ),
        # The other layer's class on a GShard model file.
        (
            "gshard_top2_base.gin",
            ["SwitchFeedForward.num_experts = 16"],
            "`SwitchFeedForward.num_experts` was bound but the model's sparse layer is "
            "GShardFeedForward; nothing read it.",
        ),
        (
            "tiny.gin",
            ["GShardFeedForward.num_experts = 4", "Top2Router.jitter_noise = 0.1"],
            "`GShardFeedForward.num_experts`, `Top2Router.jitter_noise` were bound but the model "
            "has no sparse layer (a dense model); nothing read them.",
        ),
    ],
)
def test_a_binding_nothing_read_is_refused_by_name(files, bindings, message):
    with pytest.raises(GinConfigError) as error:
        parse_gin(files, bindings)
    assert message in str(error.value)


def test_the_scope_hint_names_the_reference_that_reads_it():
    with pytest.raises(
        GinConfigError,
        match=r"gin called SwitchFeedForward\. A binding of "
        r"`encoder/SwitchFeedForward` is read only where a binding refers to "
        r"`@encoder/SwitchFeedForward`",
    ):
        parse_gin("switch_tiny.gin", "encoder/SwitchFeedForward.batch_prioritized_routing = True")


def test_read_bindings_reach_the_model():
    # The same scoped binding, with the reference that calls it in its scope.
    config = parse_gin(
        "switch_tiny.gin",
        [
            "T5Config.encoder_sparse_ffn = @encoder/SwitchFeedForward",
            "encoder/SwitchFeedForward.batch_prioritized_routing = True",
            "SwitchFeedForward.num_experts = 4",
        ],
    )
    model = build_model()
    encoder, decoder = model.encoder_layers[1].ffn, model.decoder_layers[1].ffn
    assert encoder.router.batch_prioritized_routing and not decoder.router.batch_prioritized_routing
    assert encoder.num_experts == decoder.num_experts == config.num_experts == 4


def test_bindings_that_another_command_or_a_later_call_reads_are_kept():
    from keras_moe.training import train_configurables  # noqa: F401  (train, CheckpointConfig)

    parse_gin(
        "tiny_local.gin",
        [
            "CheckpointConfig.keep = 2",
            "DatasetConfig.shuffle = False",  # the job's collaborators
            "build_model.compile = True",  # the job calls build_model after parsing
            "make_optimizer.name = 'sgd'",
            "train.log_every = 3",
            "BATCH_SIZE = 4",
        ],
    )
    parse_gin(
        ["tiny_local.gin", "distill.gin"],
        ['TEACHER_CHECKPOINT = "/tmp/teacher"', "build_distiller.alpha = 0.5"],
    )
    # A file that configures no model (build_model.config unbound) is not checked.
    assert parse_gin([], ["SwitchFeedForward.num_experts = 4"]) is None


@pytest.mark.e2e
def test_a_training_run_refuses_a_binding_its_model_did_not_read(tmp_path):
    """Gin parsed without the check (raw gin in a notebook, or bindings added after
    `parse_gin`): the run refuses the binding once its model is built, before it
    reads data or writes into the model dir."""
    from keras_moe.training import train_configurables
    from tests.training.helpers import TINY

    parse_gin("tiny_local.gin", TINY, check_unread=False)
    gin.parse_config("GShardFeedForward.num_experts = 4")
    with pytest.raises(
        GinConfigError,
        match=r"`GShardFeedForward.num_experts` was bound but "
        r"the model's sparse layer is SwitchFeedForward; nothing read it",
    ):
        train_configurables.train(
            str(tmp_path),
            tensorboard=False,
            verbose=0,
            write_config=train_configurables.write_operative_config,
        )
    assert not (tmp_path / "operative_config.gin").exists()
