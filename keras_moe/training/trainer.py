"""The training job: strategy, data, model, optimizer, `model.fit`, checkpoints, plot.

`train(model_dir, ...)` is gin-configurable (see `gin_configurables`); every
setting (a field of `keras_moe.training.run.TrainConfig`) can be bound in a run
file, e.g. `train.batch_size = %BATCH_SIZE`. The run itself is a
`keras_moe.training.run.Run`; this module keeps the pieces it shares with the
other tools (model dir checks, the compiled model, dtype policies, the summary text).
"""

import contextlib
import dataclasses
import inspect
import math
import os
import tempfile

from keras_moe.training.errors import TrainingConfigError

# Keras dtype policies a run may train under (`train.dtype_policy`): float32
# everywhere; float32 variables with bfloat16 compute (the routers stay float32,
# see `keras_moe.routing.base.Router`); bfloat16 variables and compute.
DTYPE_POLICIES = ("float32", "mixed_bfloat16", "bfloat16")


def check_dtype_policy(dtype_policy, name="train.dtype_policy"):
    """Returns `dtype_policy` if it is one of `DTYPE_POLICIES`, else raises.

    Args:
        dtype_policy: the policy's name, e.g. "mixed_bfloat16".
        name: the setting named in the error message.

    Raises:
        TrainingConfigError: naming the setting and the allowed values.

    Example:
    >>> check_dtype_policy("mixed_bfloat16")
    'mixed_bfloat16'
    >>> check_dtype_policy("fp16")
    Traceback (most recent call last):
    ...
    keras_moe.training.errors.TrainingConfigError: train.dtype_policy must be one of 'float32', 'mixed_bfloat16', 'bfloat16'; got 'fp16'.
    """  # noqa: E501 - verbatim output lines
    if not isinstance(dtype_policy, str) or dtype_policy not in DTYPE_POLICIES:
        allowed = ", ".join(repr(p) for p in DTYPE_POLICIES)
        raise TrainingConfigError(
            f"{name} must be one of {allowed}; got {dtype_policy!r}.")
    return dtype_policy


@contextlib.contextmanager
def dtype_policy_scope(dtype_policy):
    """Keras' global dtype policy is `dtype_policy` inside the block, the previous one after.

    Layers keep the policy they were built with, so building the model inside
    the block is enough; restoring it leaves a notebook's later layers as they were.

    Args:
        dtype_policy: one of `DTYPE_POLICIES`.

    Example:
    >>> import keras
    >>> before = keras.config.dtype_policy().name
    >>> with dtype_policy_scope("mixed_bfloat16"):
    ...     layer = keras.layers.Dense(2)
    >>> layer.compute_dtype, layer.variable_dtype
    ('bfloat16', 'float32')
    >>> keras.config.dtype_policy().name == before
    True
    """
    import keras

    check_dtype_policy(dtype_policy)
    previous = keras.config.dtype_policy()
    keras.config.set_dtype_policy(dtype_policy)
    try:
        yield
    finally:
        keras.config.set_dtype_policy(previous)


def prepare_model_dir(model_dir):
    """Creates `model_dir` if needed and checks it is a writable folder."""
    if not model_dir or not isinstance(model_dir, str):
        raise TrainingConfigError(f"--model_dir must be a folder path, got {model_dir!r}.")
    if model_dir.startswith("gs://"):
        raise TrainingConfigError(
            f"--model_dir {model_dir!r}: gs:// paths are not supported by the atomic "
            "checkpoint writer; use a local or mounted (gcsfuse) folder.")
    if os.path.exists(model_dir) and not os.path.isdir(model_dir):
        raise TrainingConfigError(f"--model_dir {model_dir!r} exists and is not a folder.")
    try:
        os.makedirs(model_dir, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=model_dir, prefix=".write-test-"):
            pass
    except OSError as e:
        raise TrainingConfigError(f"--model_dir {model_dir!r} is not writable: {e}") from None
    return os.path.abspath(model_dir)


def build_compiled_model(optimizer=None, jit_compile="auto", steps_per_execution=1, model=None):
    """The model of the factory `model` (default: gin's `build_model`,
    `keras_moe.models.gin_configurables.build_model`), compiled with its
    `compile_defaults` (T5: the T5 loss).

    Args:
        optimizer: a Keras optimizer, or a factory of one called here (so under
            the caller's strategy scope); None: `make_optimizer()` with its
            own defaults (run files bind `train.optimizer = @make_optimizer`).
        jit_compile, steps_per_execution: as for `Model.compile`.
        model: a factory of the uncompiled model, e.g. gin's `@build_model` or
            `@build_distiller`.
    """
    import keras

    from keras_moe.training import schedules

    if model is None:
        from keras_moe.models import gin_configurables

        model = gin_configurables.build_model
    try:
        built = model()
    except (TypeError, ValueError) as e:
        raise TrainingConfigError(f"cannot build the model from the gin config: {e}") from None
    if callable(optimizer) and not isinstance(optimizer, keras.optimizers.Optimizer):
        optimizer = optimizer()  # A factory (gin `@make_optimizer`), called in scope.
    if optimizer is None:
        optimizer = schedules.make_optimizer()
    kwargs = built.compile_defaults(optimizer=optimizer, jit_compile=jit_compile)
    built.compile(steps_per_execution=steps_per_execution, **kwargs)
    return built


class TrainSummary(dict):
    """`train`'s summary (a dict, as written to summary.json) with the trained model as `.model`."""

    model = None


def train(model_dir, **settings):
    """Trains a model on a seqio task; returns its summary and the trained model.

    `Run(model_dir, TrainConfig(**settings)).train()` (`keras_moe.training.run`).

    Args:
        model_dir: output folder (checkpoints/, backup/, logs/train and logs/validation
            (TensorBoard), operative_config.gin, expert_load.png, expert_load_history.json
            and .png, summary.json).
        **settings: the fields of `TrainConfig` (its docstring says what each does).

    Returns:
        a `TrainSummary`: the dict written to summary.json (steps, losses,
        paths), with the trained model as its `.model`.
    """
    from keras_moe.training.run import Run, TrainConfig

    return Run(model_dir, TrainConfig(**settings)).train()


def _train_signature():
    # gin reads a function's parameters to check and bind `train.<name>`; the
    # settings are TrainConfig's fields, so the signature is made from them.
    from keras_moe.training.run import TrainConfig

    params = [inspect.Parameter("model_dir", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
    params += [inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=f.default)
               for f in dataclasses.fields(TrainConfig)]
    return inspect.Signature(params)


train.__signature__ = _train_signature()


def format_summary(summary):
    """Human-readable end-of-run summary."""
    lines = ["", "=" * 72, "keras_moe training summary", "=" * 72]
    lines.append(f"task            {summary['task']}  (strategy {summary['strategy']}, "
                 f"{summary['replicas']} replica(s))")
    resumed = f"  (resumed from {summary['resumed_from']})" if summary["resumed_from"] else ""
    if summary.get("mesh"):
        lines.append(f"device mesh     {summary['mesh']}")
        for name, full, local in summary["shards"]:
            lines.append(f"  {name}: {tuple(full)} -> {tuple(local)} on one device")
    lines.append(f"steps           {summary['start_step']} -> {summary['end_step']}{resumed}")
    if summary["first_step_loss"] is not None:
        lines.append(f"train loss      first step {summary['first_step_loss']:.4f}, "
                     f"last epoch mean {summary['last_epoch_loss']:.4f}")
    elif summary["last_epoch_loss"] is not None:
        lines.append(f"train loss      last epoch mean {summary['last_epoch_loss']:.4f}")
    if summary["eval_end"]:
        start = summary["eval_start"]
        before = f"{start['loss']:.4f} -> " if start else ""
        lines.append(f"{summary['eval_split']} loss{' ' * max(1, 6 - len(summary['eval_split']))}"
                     f"{before}{summary['eval_end']['loss']:.4f} "
                     f"(accuracy {summary['eval_end'].get('accuracy', math.nan):.3f})")
    lines.append(f"time            {summary['train_seconds']:.0f} s training, "
                 f"{summary['wall_seconds']:.0f} s in total")
    lines.append(f"checkpoint      {summary['checkpoint']}")
    lines.append(f"tensorboard     tensorboard --logdir {summary['tensorboard']}")
    lines.append(f"expert load     {summary['expert_load_plot']}")
    if summary.get("expert_load_history"):
        lines.append(f"load history    {summary['expert_load_history']}")
    lines.append(f"gin config      {summary['operative_config']}")
    lines.append("=" * 72)
    return "\n".join(lines)
