"""Initialising the student copies exactly the shared weights, and only those."""

import keras
import numpy as np
import pytest

from keras_moe.distill import dense_student_config, init_student_from_teacher, relative_paths
from keras_moe.models import build_model
from tests.distill.helpers import teacher_config


@pytest.fixture(scope="module")
def teacher():
    keras.utils.set_random_seed(1)
    return build_model(teacher_config(activation="gated-gelu"))


def _snapshot(model):
    return {path: np.array(v.numpy()) for path, v in relative_paths(model).items()}


def _expert_positions(config):
    """Student FFN paths at the teacher's sparse layers, from the config (not from the code)."""
    out = set()
    for side, layers in (
        ("encoder", config.resolved_encoder_sparse_layers()),
        ("decoder", config.resolved_decoder_sparse_layers()),
    ):
        for i in layers:
            out |= {f"{side}_layer_{i}/ffn/{name}" for name in ("wi_0", "wi_1", "wo")}
    return out


def test_copies_shared_weights_exactly_and_nothing_else(teacher):
    student = build_model(dense_student_config(teacher.config))
    before = _snapshot(student)
    teacher_before = _snapshot(teacher)
    report = init_student_from_teacher(student, teacher)
    after = _snapshot(student)
    expert_positions = _expert_positions(teacher.config)
    assert expert_positions == {
        "encoder_layer_1/ffn/wi_0",
        "encoder_layer_1/ffn/wi_1",
        "encoder_layer_1/ffn/wo",
        "decoder_layer_0/ffn/wi_0",
        "decoder_layer_0/ffn/wi_1",
        "decoder_layer_0/ffn/wo",
        "decoder_layer_1/ffn/wi_0",
        "decoder_layer_1/ffn/wi_1",
        "decoder_layer_1/ffn/wo",
    }
    assert set(report["fresh"]) == expert_positions
    assert report["from_experts"] == []
    shared = set(after) - expert_positions
    assert set(report["copied"]) == shared
    # Every non-expert kind of weight is among the copied ones.
    for needed in (
        "token_embedding/embeddings",
        "encoder_position_bias/embeddings",
        "decoder_position_bias/embeddings",
        "lm_head/kernel",
        "encoder_norm/scale",
        "decoder_layer_1/cross_attention/key",
        "encoder_layer_0/ffn/wi_0",
        "encoder_layer_0/attention_norm/scale",
    ):
        assert needed in shared
    for path in shared:
        np.testing.assert_array_equal(after[path], teacher_before[path], err_msg=path)
    experts = {p: v for p, v in teacher_before.items() if "/experts/" in p or "/router/" in p}
    assert experts
    for path in expert_positions:
        np.testing.assert_array_equal(after[path], before[path], err_msg=path)  # fresh, untouched
        source = teacher_before[path.replace("/ffn/", "/ffn/experts/")]
        assert not np.allclose(after[path], source.mean(0))
        assert not np.allclose(after[path], source[0])
    for path, value in _snapshot(teacher).items():  # the teacher is not modified
        np.testing.assert_array_equal(value, teacher_before[path], err_msg=path)


@pytest.mark.parametrize("expert_init", ["mean", "expert0"])
def test_expert_init_options(teacher, expert_init):
    student = build_model(dense_student_config(teacher.config))
    report = init_student_from_teacher(student, teacher, expert_init=expert_init)
    after = _snapshot(student)
    source = _snapshot(teacher)
    assert set(report["from_experts"]) == _expert_positions(teacher.config)
    assert report["fresh"] == []
    for path in report["from_experts"]:
        experts = source[path.replace("/ffn/", "/ffn/experts/")].astype(np.float64)
        expected = experts.mean(0) if expert_init == "mean" else experts[0]
        np.testing.assert_allclose(after[path], expected, rtol=1e-6, atol=1e-7, err_msg=path)


def test_relative_paths_ignore_an_outer_scope(teacher):
    with keras.name_scope("outer"):
        nested = build_model(teacher.config)
    assert any(v.path.startswith("outer/") for v in nested.weights)
    assert set(relative_paths(nested)) == set(relative_paths(teacher))


def test_shape_mismatch_and_bad_expert_init(teacher):
    wider = build_model(dense_student_config(teacher.config, d_model=24))
    with pytest.raises(ValueError, match="shape"):
        init_student_from_teacher(wider, teacher)
    student = build_model(dense_student_config(teacher.config))
    with pytest.raises(ValueError, match="expert_init"):
        init_student_from_teacher(student, teacher, expert_init="median")
    small_experts = build_model(teacher_config(activation="gated-gelu", expert_d_ff=12))
    student = build_model(dense_student_config(small_experts.config))
    with pytest.raises(ValueError, match="expert_init"):
        init_student_from_teacher(student, small_experts, expert_init="mean")
    report = init_student_from_teacher(student, small_experts)  # "none": FFNs stay fresh
    assert "encoder_layer_1/ffn/wo" in report["fresh"]


def test_dense_student_config_has_no_experts(teacher):
    config = dense_student_config(teacher.config)
    assert config.sparse_ffn is None and not config.is_sparse
    assert config.resolved_encoder_sparse_layers() == ()
    assert config.resolved_decoder_sparse_layers() == ()
    assert (config.d_model, config.d_ff, config.vocab_size) == (16, 24, 40)
