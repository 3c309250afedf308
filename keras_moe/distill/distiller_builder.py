"""`build_distiller`: teacher from a checkpoint, dense student initialised from it, `Distiller`."""

from keras_moe import models
from keras_moe.convert import from_hf, is_hf_folder
from keras_moe.distill import distillation_objective as losses_lib
from keras_moe.distill.distiller import Distiller
from keras_moe.distill.init_from_teacher import dense_student_config, init_student_from_teacher
from keras_moe.training.checkpoint import resolve_checkpoint
from keras_moe.training.log import log

LOG_SOURCE = "keras_moe.distill"


def load_teacher(teacher_checkpoint, teacher_config=None):
    """The teacher `EncoderDecoder` with trained weights.

    Args:
        teacher_checkpoint: a Hugging Face T5/SwitchTransformers folder
            (`config.json` + safetensors; the architecture comes from it), or a
            keras_moe `.weights.h5` / checkpoint folder / model dir (then
            `teacher_config` gives the architecture it was trained with).
        teacher_config: `T5Config` of a keras_moe checkpoint.

    Example:
    >>> import os, shutil, tempfile
    >>> import numpy as np
    >>> from keras_moe import SwitchFeedForward
    >>> from keras_moe.models import EncoderDecoder, T5Config
    >>> from keras_moe.training.checkpoint import CheckpointManager
    >>> config = T5Config(vocab_size=32, d_model=16, num_heads=2, d_kv=8, d_ff=32,
    ...     num_encoder_layers=2, num_decoder_layers=2, encoder_sparse_step=2,
    ...     decoder_sparse_step=2, sparse_ffn=SwitchFeedForward(num_experts=4, d_ff=32))
    >>> trained = EncoderDecoder(config)  # stands in for a trained model
    >>> model_dir = tempfile.mkdtemp()
    >>> _ = CheckpointManager(os.path.join(model_dir, "checkpoints")).save(trained, step=300)
    >>> teacher = load_teacher(model_dir, config)
    [keras_moe.distill] teacher: .../checkpoints/ckpt-00000300.weights.h5
    >>> all(np.array_equal(a, b) for a, b in zip(teacher.get_weights(), trained.get_weights()))
    True
    >>> shutil.rmtree(model_dir)
    """

    if not isinstance(teacher_checkpoint, str) or not teacher_checkpoint:
        raise ValueError(f"`teacher_checkpoint` must be a path, got {teacher_checkpoint!r}.")

    if is_hf_folder(teacher_checkpoint):
        log(f"teacher: Hugging Face checkpoint {teacher_checkpoint}", source=LOG_SOURCE)
        return from_hf(teacher_checkpoint)
    if teacher_config is None:
        raise ValueError(
            "`teacher_config` is required with a keras_moe `teacher_checkpoint` "
            f"({teacher_checkpoint!r}): the architecture it was trained with."
        )
    weights = resolve_checkpoint(teacher_checkpoint, "teacher_checkpoint")
    teacher = models.model_builder.build_model(teacher_config)
    try:
        teacher.load_weights(weights)
    except (ValueError, KeyError, OSError) as e:
        raise ValueError(
            f"`teacher_checkpoint` {weights} does not fit `teacher_config` "
            f"(bind the gin model file it was trained with): {e}"
        ) from None
    log(f"teacher: {weights}", source=LOG_SOURCE)
    return teacher


def build_distiller(
    teacher_checkpoint=None,
    teacher_config=None,
    student_config=None,
    alpha=0.25,
    temperature=1.0,
    scale_soft_loss=True,
    init_student=True,
    expert_init="none",
    teacher=None,
    student_overrides=None,
):
    """Builds a `Distiller` (gin-configurable as `build_distiller`).

    Args:
        teacher_checkpoint: trained teacher (see `load_teacher`).
        teacher_config: the teacher's `T5Config` (gin: `@T5Config()`, i.e. the
            architecture of the model gin file the teacher was trained with).
        student_config: the student's `T5Config`; None: the teacher's with
            every MoE layer dense (`dense_student_config`), updated with
            `student_overrides`.
        alpha: weight of the soft (teacher) term, in [0, 1] (paper: 0.25).
        temperature: softmax temperature of the soft targets, > 0.
        scale_soft_loss: multiply the soft term by `temperature ** 2`.
        init_student: copy the teacher's non-expert weights into the student.
        expert_init: "none" (paper), "mean" or "expert0" for the FFNs at
            expert positions (see `init_student_from_teacher`).
        teacher: an already built teacher (instead of `teacher_checkpoint`).
        student_overrides: dict of `T5Config` fields changed in the derived student.

    Returns:
        a `Distiller` (not compiled).

    Example:
    >>> import os, shutil, tempfile
    >>> from keras_moe import SwitchFeedForward
    >>> from keras_moe.models import EncoderDecoder, T5Config
    >>> from keras_moe.training.checkpoint import CheckpointManager
    >>> config = T5Config(vocab_size=32, d_model=16, num_heads=2, d_kv=8, d_ff=32,
    ...     num_encoder_layers=2, num_decoder_layers=2, encoder_sparse_step=2,
    ...     decoder_sparse_step=2, sparse_ffn=SwitchFeedForward(num_experts=4, d_ff=32))
    >>> model_dir = tempfile.mkdtemp()  # a teacher checkpoint, as keras-moe-train writes it
    >>> _ = CheckpointManager(os.path.join(model_dir, "checkpoints")).save(
    ...     EncoderDecoder(config), step=300)
    >>> distiller = build_distiller(model_dir, teacher_config=config)
    [keras_moe.distill] teacher: .../checkpoints/ckpt-00000300.weights.h5
    [keras_moe.distill] student initialised from the teacher: 46 variables copied,
    0 from experts (none), 6 fresh
    >>> distiller.student.config.is_sparse, distiller.teacher.trainable
    (False, False)
    >>> shutil.rmtree(model_dir)
    """

    losses_lib.check_alpha(alpha)
    losses_lib.check_temperature(temperature)
    if teacher is None:
        teacher = load_teacher(teacher_checkpoint, teacher_config)
    if student_config is None:
        student_config = dense_student_config(teacher.config, **(student_overrides or {}))
    elif student_overrides:
        raise ValueError("`student_overrides` applies only when `student_config` is None.")
    student = models.model_builder.build_model(student_config)
    if init_student:
        report = init_student_from_teacher(student, teacher, expert_init=expert_init)
        log(
            f"student initialised from the teacher: {len(report['copied'])} variables copied, "
            f"{len(report['from_experts'])} from experts ({expert_init}), "
            f"{len(report['fresh'])} fresh",
            source=LOG_SOURCE,
        )
    return Distiller(
        teacher, student, alpha=alpha, temperature=temperature, scale_soft_loss=scale_soft_loss
    )
