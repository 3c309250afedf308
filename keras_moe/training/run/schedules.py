"""Learning-rate schedules and the optimizer factory (gin: `make_optimizer`).

T5 trains with Adafactor and the inverse square root schedule
`lr(step) = scale / sqrt(max(step, warmup_steps))` (constant `scale /
sqrt(warmup_steps)` during warm-up). Keras' Adafactor already takes
`min(lr, 1 / sqrt(step))` and multiplies the step by the parameter scale
(`max(epsilon_2, rms(variable))`), as T5's `multiply_by_parameter_scale`;
with the T5 schedule (scale 1, warm-up 10k) the `min` never bites.
"""

import math

import keras
from keras import ops

from keras_moe import compat
from keras_moe.models.adafactor import Adafactor
from keras_moe.training.errors import TrainingConfigError
from keras_moe.validation import is_int, is_number

OPTIMIZERS = ("adafactor", "adam", "adamw", "sgd")
SCHEDULES = ("rsqrt", "constant")


@keras.saving.register_keras_serializable(package="keras_moe")
class InverseSqrtSchedule(keras.optimizers.schedules.LearningRateSchedule):
    """`scale / sqrt(max(step, warmup_steps))`, optionally capped (T5's "rsqrt_decay").

    Args:
        scale: numerator (T5: 1.0), > 0.
        warmup_steps: steps of constant learning rate, >= 1 (T5: 10000).
        max_learning_rate: optional upper bound, > 0.

    Example:
    >>> schedule = InverseSqrtSchedule(scale=1.0, warmup_steps=100)
    >>> round(float(schedule(0)), 6), round(float(schedule(400)), 6)  # float32 tensors
    (0.1, 0.05)
    >>> schedule.value(400)  # the same as a Python float
    0.05
    """

    def __init__(self, scale=1.0, warmup_steps=10000, max_learning_rate=None):
        _check_positive("scale", scale)
        if not is_int(warmup_steps) or warmup_steps < 1:
            raise TrainingConfigError(
                f"`warmup_steps` must be an integer >= 1, got {warmup_steps!r}."
            )
        if max_learning_rate is not None:
            _check_positive("max_learning_rate", max_learning_rate)
        self.scale = float(scale)
        self.warmup_steps = int(warmup_steps)
        self.max_learning_rate = None if max_learning_rate is None else float(max_learning_rate)

    def __call__(self, step):
        step = ops.cast(step, "float32")
        lr = self.scale / ops.sqrt(ops.maximum(step, float(self.warmup_steps)))
        if self.max_learning_rate is not None:
            lr = ops.minimum(lr, self.max_learning_rate)
        return lr

    def value(self, step):
        """The learning rate at `step` as a Python float (no tensors)."""
        lr = self.scale / math.sqrt(max(float(step), float(self.warmup_steps)))
        if self.max_learning_rate is not None:
            lr = min(lr, self.max_learning_rate)
        return lr

    def get_config(self):
        return {
            "scale": self.scale,
            "warmup_steps": self.warmup_steps,
            "max_learning_rate": self.max_learning_rate,
        }


def _check_positive(name, value):
    if not is_number(value) or not value > 0:
        raise TrainingConfigError(f"`{name}` must be a number > 0, got {value!r}.")


def make_optimizer(
    name="adafactor",
    learning_rate=1.0,
    schedule="rsqrt",
    warmup_steps=10000,
    max_learning_rate=None,
    beta_1=0.9,
    beta_2=0.999,
    weight_decay=None,
    clipnorm=None,
    global_clipnorm=None,
):
    """Builds the training optimizer (gin-configurable as `make_optimizer`).

    Args:
        name: "adafactor" (T5), "adam", "adamw" or "sgd".
        learning_rate: the schedule's scale for "rsqrt" (T5: 1.0), the
            learning rate for "constant".
        schedule: "rsqrt" (`InverseSqrtSchedule`) or "constant".
        warmup_steps: warm-up of the rsqrt schedule.
        max_learning_rate: optional cap of the rsqrt schedule.
        beta_1, beta_2: Adam moments.
        weight_decay: AdamW/others' decoupled weight decay.
        clipnorm, global_clipnorm: gradient clipping (Keras semantics).

    Returns:
        a `keras.optimizers.Optimizer`.

    Example:
    >>> opt = make_optimizer("adam", learning_rate=1e-3, schedule="constant")
    >>> type(opt).__name__, round(float(opt.learning_rate), 6)
    ('Adam', 0.001)
    >>> opt = make_optimizer(warmup_steps=100)  # T5: Adafactor, 1 / sqrt(max(step, warm-up))
    >>> type(opt).__name__, learning_rate_at(opt, 400)
    ('Adafactor', 0.05)
    """
    if name not in OPTIMIZERS:
        raise TrainingConfigError(
            f"`make_optimizer.name` must be one of {OPTIMIZERS}, got {name!r}."
        )
    if schedule not in SCHEDULES:
        raise TrainingConfigError(
            f"`make_optimizer.schedule` must be one of {SCHEDULES}, got {schedule!r}."
        )
    _check_positive("make_optimizer.learning_rate", learning_rate)
    if schedule == "rsqrt":
        lr = InverseSqrtSchedule(learning_rate, warmup_steps, max_learning_rate)
    else:
        lr = float(learning_rate)
    common = {}
    if clipnorm is not None:
        common["clipnorm"] = clipnorm
    if global_clipnorm is not None:
        common["global_clipnorm"] = global_clipnorm
    if name == "adafactor":
        if weight_decay is not None:
            common["weight_decay"] = weight_decay
        return Adafactor(learning_rate=lr, **common)
    if name == "adam":
        if weight_decay is not None:
            common["weight_decay"] = weight_decay
        return keras.optimizers.Adam(learning_rate=lr, beta_1=beta_1, beta_2=beta_2, **common)
    if name == "adamw":
        return keras.optimizers.AdamW(
            learning_rate=lr,
            beta_1=beta_1,
            beta_2=beta_2,
            weight_decay=0.004 if weight_decay is None else weight_decay,
            **common,
        )
    return keras.optimizers.SGD(learning_rate=lr, **common)


def learning_rate_at(optimizer, step):
    """The optimizer's learning rate at `step` as a float (schedules evaluated)."""

    lr = compat.learning_rate_schedule(optimizer)
    if isinstance(lr, InverseSqrtSchedule):
        return lr.value(step)
    if callable(lr):
        return float(ops.convert_to_numpy(lr(step)))
    return float(ops.convert_to_numpy(lr))
