"""The dense counterpart of a sparse model's config: a distillation student, or the
dense model that upcycling starts from."""

import dataclasses


def dense_student_config(teacher_config, **overrides):
    """The teacher's `T5Config` with every MoE layer replaced by a dense FFN.

    Args:
        teacher_config: the teacher's `T5Config`.
        **overrides: other fields to change (e.g. `d_ff=...`; shared weights
            must keep their shapes to be copied).

    Example:
    >>> from keras_moe.models import T5Config
    >>> from keras_moe import SwitchFeedForward
    >>> dense_student_config(T5Config(encoder_sparse_step=2, decoder_sparse_step=2,
    ...     sparse_ffn=SwitchFeedForward(num_experts=8, d_ff=2048))).is_sparse
    False
    """
    changes = dict(
        sparse_ffn=None,
        encoder_sparse_ffn=None,
        decoder_sparse_ffn=None,
        encoder_sparse_step=0,
        decoder_sparse_step=0,
        encoder_sparse_layers=None,
        decoder_sparse_layers=None,
    )
    changes.update(overrides)
    return dataclasses.replace(teacher_config, **changes)
