"""`Distiller`: trains a (dense) student on hard labels and a frozen teacher's soft targets."""

import keras
from keras import ops

from keras_moe.distill import distillation_objective as losses_lib
from keras_moe.models import seq2seq_objective
from keras_moe.models.distribute_compat import DistributedBuildMixin


def _vocab_size(model, role):
    config = getattr(model, "config", None)
    size = getattr(config, "vocab_size", None)
    if size is None:
        raise ValueError(
            f"`{role}` must be a keras_moe EncoderDecoder (with a `config` holding "
            f"`vocab_size`), got {type(model).__name__}."
        )
    return size


@keras.saving.register_keras_serializable(package="keras_moe")
class Distiller(DistributedBuildMixin, keras.Model):
    """Distils a frozen teacher (e.g. a Switch Transformer) into a student (e.g. a dense T5).

    Calling the distiller runs the student; training minimises
    `(1 - alpha) * hard + alpha * soft` (see `keras_moe.distill.distillation_objective`) plus
    the student's own `losses` (aux / z losses when the student is sparse).
    The teacher is frozen (`trainable=False`: only the student's variables are
    trained) and always runs with `training=False`, so its MoE layers use the
    eval capacity factor and no jitter; its own aux losses are not added.
    The logged metrics are `loss`, `hard_loss`, `soft_loss`, `kl_to_teacher`
    (at temperature `T`, without the `T**2` factor) and the student's compiled
    metrics (`compile_defaults`: weighted accuracy and `neg_log_perplexity`).

    The loss lives in `compute_loss` (written with `keras.ops`), so `fit` and
    `evaluate` use each backend's own train/test step. `keras.distillation.Distiller`
    is not used: it ignores `sample_weight` (padding tokens would count) and
    the student's aux losses.

    Data: Keras `(inputs, targets, loss_weights)` as from
    `keras_moe.models.seqio_to_keras`, or a feature dict holding
    `decoder_target_tokens` (and `decoder_loss_weights`).

    Args:
        teacher: a built `EncoderDecoder` (set to `trainable=False`).
        student: a built `EncoderDecoder` with the same `vocab_size`.
        alpha: weight of the soft (teacher) term in [0, 1]; the hard-label
            term gets `1 - alpha`. Default 0.25 (Switch Transformer's best).
        temperature: softmax temperature of the soft term, > 0.
        scale_soft_loss: multiply the soft term by `temperature ** 2`.

    Example:
    >>> import os, shutil, tempfile
    >>> import numpy as np
    >>> import tensorflow as tf
    >>> from keras_moe.distill.init_from_teacher import (dense_student_config,
    ...     init_student_from_teacher)
    >>> from keras_moe import SwitchFeedForward
    >>> from keras_moe.models import EncoderDecoder, T5Config, seqio_to_keras
    >>> teacher = EncoderDecoder(T5Config(vocab_size=64, d_model=32, num_heads=4, d_kv=8,
    ...     d_ff=64, num_encoder_layers=2, num_decoder_layers=2, encoder_sparse_step=2,
    ...     decoder_sparse_step=2, sparse_ffn=SwitchFeedForward(num_experts=4, d_ff=64)))
    >>> student = EncoderDecoder(dense_student_config(teacher.config))
    >>> report = init_student_from_teacher(student, teacher)
    >>> distiller = Distiller(teacher, student, alpha=0.25, temperature=1.0)
    >>> distiller.compile(**distiller.compile_defaults(learning_rate=1e-3),
    ...                   run_eagerly=True)  # eager: no tracing for one step
    >>> dataset = tf.data.Dataset.from_tensor_slices({  # seqio features, as converted
    ...     "encoder_input_tokens": np.array([[5, 6, 1, 0]] * 4, "int32"),
    ...     "decoder_input_tokens": np.array([[0, 7, 8]] * 4, "int32"),
    ...     "decoder_target_tokens": np.array([[7, 8, 1]] * 4, "int32"),
    ...     "decoder_loss_weights": np.array([[1, 1, 1]] * 4, "int32")}).batch(2)
    >>> history = distiller.fit(dataset.map(seqio_to_keras), steps_per_epoch=1, verbose=0)
    >>> sorted(history.history)
    ['accuracy', 'hard_loss', 'kl_to_teacher', 'loss', 'neg_log_perplexity', 'soft_loss']
    >>> folder = tempfile.mkdtemp()
    >>> distiller.student.save_weights(os.path.join(folder, "student.weights.h5"))
    >>> shutil.rmtree(folder)
    """

    def __init__(
        self, teacher, student, alpha=0.25, temperature=1.0, scale_soft_loss=True, **kwargs
    ):
        super().__init__(**kwargs)
        self.alpha = losses_lib.check_alpha(alpha)
        self.temperature = losses_lib.check_temperature(temperature)
        if not isinstance(scale_soft_loss, bool):
            raise ValueError(f"`scale_soft_loss` must be a bool, got {scale_soft_loss!r}.")
        self.scale_soft_loss = scale_soft_loss
        if teacher is student:
            raise ValueError("`teacher` and `student` must be different models.")
        teacher_vocab = _vocab_size(teacher, "teacher")
        student_vocab = _vocab_size(student, "student")
        if teacher_vocab != student_vocab:
            raise ValueError(
                f"`student` vocab_size ({student_vocab}) must equal the `teacher`'s "
                f"({teacher_vocab}): the soft targets are distributions over one vocabulary."
            )
        self.teacher = teacher
        self.student = student
        self.teacher.trainable = False
        self.hard_loss_tracker = keras.metrics.Mean(name="hard_loss")
        self.soft_loss_tracker = keras.metrics.Mean(name="soft_loss")
        self.kl_tracker = keras.metrics.Mean(name="kl_to_teacher")
        self.built = True

    @property
    def config(self):
        """The student's `T5Config` (the model being trained)."""
        return self.student.config

    def build(self, input_shape=None):
        self.built = True

    def call(self, inputs, training=None):
        return self.student(inputs, training=training)

    def teacher_logits(self, inputs):
        """The frozen teacher's logits (inference mode, no gradient)."""
        return ops.stop_gradient(self.teacher(inputs, training=False))

    def _targets(self, x, y, sample_weight):
        if y is None and isinstance(x, dict) and "decoder_target_tokens" in x:
            y = x["decoder_target_tokens"]
            if sample_weight is None:
                sample_weight = x.get("decoder_loss_weights")
        if y is None:
            raise ValueError(
                "Distiller needs targets: pass (inputs, targets, weights) or a dict "
                "with `decoder_target_tokens`."
            )
        if sample_weight is None:
            sample_weight = ops.not_equal(y, self.student.config.pad_id)
        return y, ops.cast(sample_weight, "float32")

    def compute_loss(self, x=None, y=None, y_pred=None, sample_weight=None, training=True):
        y, sample_weight = self._targets(x, y, sample_weight)
        if y_pred is None:
            y_pred = self(x, training=training)
        teacher = self.teacher_logits(x)
        loss, hard, soft = losses_lib.distillation_loss(
            y,
            y_pred,
            teacher,
            sample_weight,
            alpha=self.alpha,
            temperature=self.temperature,
            scale_soft_loss=self.scale_soft_loss,
        )
        kl = losses_lib.kl_to_teacher(teacher, y_pred, sample_weight, self.temperature)
        # Under tf.distribute each replica returns its share of the global
        # token mean (the replicas' gradients are summed), as the T5 loss does;
        # the trackers, averaged over replicas, then report the global means.
        local_weight = ops.sum(sample_weight)
        share = ops.divide_no_nan(local_weight, seq2seq_objective.global_sum(local_weight))
        replicas = seq2seq_objective.replicas_in_sync()
        self.hard_loss_tracker.update_state(hard * share * replicas)
        self.soft_loss_tracker.update_state(soft * share * replicas)
        self.kl_tracker.update_state(kl * share * replicas)
        loss = loss * share
        extra = [ops.cast(v, "float32") for v in self.student.losses]
        if extra:
            loss = loss + ops.sum(ops.stack(extra)) / replicas
        return loss

    def compute_metrics(self, x, y, y_pred, sample_weight=None):
        y, sample_weight = self._targets(x, y, sample_weight)
        return super().compute_metrics(x, y, y_pred, sample_weight=sample_weight)

    def compile_defaults(self, learning_rate=1e-3, optimizer=None, jit_compile=False):
        """`compile` arguments: Adafactor (or `optimizer`), the student's weighted metrics.

        The loss is this class's `compute_loss`, so no `loss` is given.
        """
        kwargs = seq2seq_objective.compile_defaults(
            learning_rate=learning_rate, optimizer=optimizer, jit_compile=jit_compile
        )
        kwargs.pop("loss")
        return kwargs

    def generate(self, encoder_input_tokens, **kwargs):
        """The student's `generate`."""
        return self.student.generate(encoder_input_tokens, **kwargs)

    def get_config(self):
        return {
            "teacher": keras.saving.serialize_keras_object(self.teacher),
            "student": keras.saving.serialize_keras_object(self.student),
            "alpha": self.alpha,
            "temperature": self.temperature,
            "scale_soft_loss": self.scale_soft_loss,
            "name": self.name,
        }

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        teacher = keras.saving.deserialize_keras_object(config.pop("teacher"))
        student = keras.saving.deserialize_keras_object(config.pop("student"))
        return cls(teacher, student, **config)
