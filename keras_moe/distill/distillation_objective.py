"""The distillation loss: hard labels mixed with the teacher's soft targets.

Per target token `t` with loss weight `w_t` (0 on padding):

    hard = sum_t w_t * CE(y_t, softmax(s_t))               / sum_t w_t
    soft = T**2 * sum_t w_t * CE(softmax(z_t / T), softmax(s_t / T)) / sum_t w_t
    loss = (1 - alpha) * hard + alpha * soft

where `s` are the student's logits, `z` the teacher's, `T` the temperature and
`CE(p, q) = -sum_v p_v log q_v`. The Switch Transformer (§4.2, Table 7) found
`alpha = 0.25` (0.75 hard / 0.25 soft) best.

The `T**2` factor is Hinton et al.'s convention (the soft term's gradients
scale as `1 / T**2`; the factor keeps the hard/soft balance independent of
`T`). It is 1 at the default `T = 1` and can be turned off with
`scale_soft_loss=False`. The soft term is a cross-entropy, not a KL
divergence: they differ by the teacher's entropy, a constant for the student,
so the gradients are identical; `kl_divergence` is reported as a metric.
"""

from keras import ops

from keras_moe.models.seq2seq_objective import token_log_likelihood
from keras_moe.validation import is_number


def check_alpha(alpha):
    """Raises ValueError unless `alpha` is a number in [0, 1]."""
    if not is_number(alpha) or not 0.0 <= alpha <= 1.0:
        raise ValueError(
            f"`alpha` (weight of the soft, teacher term) must be a number in [0, 1], got {alpha!r}."
        )
    return float(alpha)


def check_temperature(temperature):
    """Raises ValueError unless `temperature` is a number > 0."""
    if not is_number(temperature) or not temperature > 0:
        raise ValueError(f"`temperature` must be a number > 0, got {temperature!r}.")
    return float(temperature)


def _weights(labels, sample_weight):
    if sample_weight is None:
        return ops.ones(ops.shape(labels), "float32")
    return ops.cast(sample_weight, "float32")


def _weighted_mean(values, weights):
    return ops.sum(values * weights) / ops.maximum(ops.sum(weights), 1e-9)


def hard_loss(labels, student_logits, sample_weight=None):
    """Weighted mean token cross-entropy of the labels (the T5 loss).

    Args:
        labels: int targets `[B, L]`.
        student_logits: `[B, L, V]`.
        sample_weight: `[B, L]` loss weights (None: all ones).

    Example:
    >>> import numpy as np
    >>> round(float(hard_loss(np.array([[1, 2]]), np.zeros((1, 2, 5)))), 4)  # log(5)
    1.6094
    """
    picked = token_log_likelihood(labels, student_logits)
    return _weighted_mean(-picked, _weights(labels, sample_weight))


def soft_loss(
    teacher_logits, student_logits, sample_weight=None, temperature=1.0, scale_soft_loss=True
):
    """Weighted mean cross-entropy from `softmax(teacher / T)` to `softmax(student / T)`.

    Args:
        teacher_logits: `[B, L, V]` (treated as constants: no gradient).
        student_logits: `[B, L, V]`.
        sample_weight: `[B, L]` loss weights (None: all ones).
        temperature: softmax temperature `T > 0`.
        scale_soft_loss: multiply by `T**2` (Hinton et al.).

    Example:
    >>> import numpy as np
    >>> round(float(soft_loss(np.zeros((1, 2, 5)), np.zeros((1, 2, 5)))), 4)  # log(5)
    1.6094
    """
    temperature = check_temperature(temperature)
    teacher = ops.stop_gradient(ops.cast(teacher_logits, "float32"))
    p_teacher = ops.softmax(teacher / temperature, axis=-1)
    logq = ops.log_softmax(ops.cast(student_logits, "float32") / temperature, axis=-1)
    ce = -ops.sum(p_teacher * logq, axis=-1)
    scale = temperature**2 if scale_soft_loss else 1.0
    return scale * _weighted_mean(ce, _weights(ce, sample_weight))


def kl_to_teacher(teacher_logits, student_logits, sample_weight=None, temperature=1.0):
    """Weighted mean `KL(softmax(teacher / T) || softmax(student / T))` per token (no T² factor).

    Example:
    >>> import numpy as np
    >>> float(kl_to_teacher(np.zeros((1, 2, 5)), np.zeros((1, 2, 5))))  # same distributions
    0.0
    """
    temperature = check_temperature(temperature)
    teacher = ops.stop_gradient(ops.cast(teacher_logits, "float32"))
    logp = ops.log_softmax(teacher / temperature, axis=-1)
    logq = ops.log_softmax(ops.cast(student_logits, "float32") / temperature, axis=-1)
    kl = ops.sum(ops.exp(logp) * (logp - logq), axis=-1)
    return _weighted_mean(kl, _weights(kl, sample_weight))


def distillation_loss(
    labels,
    student_logits,
    teacher_logits,
    sample_weight=None,
    alpha=0.25,
    temperature=1.0,
    scale_soft_loss=True,
):
    """`(1 - alpha) * hard_loss + alpha * soft_loss` (see the module docstring).

    Args:
        labels: int targets `[B, L]`.
        student_logits: `[B, L, V]`.
        teacher_logits: `[B, L, V]`.
        sample_weight: `[B, L]` loss weights (padding 0).
        alpha: weight of the soft (teacher) term in [0, 1]; the paper's best is 0.25.
        temperature: softmax temperature of the soft term, > 0.
        scale_soft_loss: multiply the soft term by `temperature ** 2`.

    Returns:
        `(loss, hard, soft)` scalars.

    Example:
    >>> import numpy as np
    >>> loss, hard, soft = distillation_loss(
    ...     np.array([[1, 2]]), np.zeros((1, 2, 5)), np.ones((1, 2, 5)), alpha=0.25)
    >>> [round(float(v), 4) for v in (loss, hard, soft)]  # uniform student: all log(5)
    [1.6094, 1.6094, 1.6094]
    """
    alpha = check_alpha(alpha)
    hard = hard_loss(labels, student_logits, sample_weight)
    soft = soft_loss(teacher_logits, student_logits, sample_weight, temperature, scale_soft_loss)
    return (1.0 - alpha) * hard + alpha * soft, hard, soft
