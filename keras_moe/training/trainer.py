"""The training job: `train(model_dir, ...)`, gin-configurable as `train` (`train_configurables`).

Its arguments are the fields of `keras_moe.training.train_config.TrainConfig`:
the collaborators a run file injects (`train.dataset = @DatasetConfig()`,
`train.checkpoint = @CheckpointConfig()`, `train.placement = @MeshPlacement()`)
and the settings of the loop (`train.train_steps = %TRAIN_STEPS`, ...). The run
itself is a `keras_moe.training.run.training_run.Run`.
"""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any, cast

from keras_moe.training.run.compiled_model import build_compiled_model  # noqa: F401  (re-exported)
from keras_moe.training.run.dtype_policy import (  # noqa: F401  (re-exported)
    DTYPE_POLICIES,
    check_dtype_policy,
    dtype_policy_scope,
)
from keras_moe.training.run.model_dir import prepare_model_dir  # noqa: F401  (re-exported)
from keras_moe.training.run.summary import TrainSummary, format_summary  # noqa: F401  (re-exported)
from keras_moe.training.run.training_run import Run
from keras_moe.training.train_config import TrainConfig


def train(
    model_dir: str | None, return_config: bool = False, **settings: Any
) -> TrainSummary | TrainConfig:
    """Trains a model on a seqio task; returns its summary and the trained model.

    Args:
        model_dir: output folder (checkpoints/, backup/, logs/train and logs/validation
            (TensorBoard), operative_config.gin, expert_load.png, expert_load_history.json
            and .png, summary.json).
        return_config: return the `TrainConfig` (unchecked: its collaborators as
            bound, None where unbound) instead of training, as the compile and
            eval tools read the job (`train_configurables.job_config`).
        **settings: the fields of `TrainConfig` (its docstring says what each
            does), or the flat shorthands of earlier run files
            (`train_config.SHORTHANDS`, e.g. `batch_size=8`) when the collaborator
            they belong to is not given.

    Returns:
        a `TrainSummary`: the dict written to summary.json (steps, losses,
        paths), with the trained model as its `.model`.

    Example:
    >>> config = train(None, return_config=True, batch_size=4, train_steps=10)
    >>> config.dataset.batch_size, config.checkpoint, config.train_steps
    (4, None, 10)
    """
    config = TrainConfig.from_settings(**settings)
    if return_config:
        return config
    return Run(model_dir, config).train()


def _train_signature() -> inspect.Signature:
    # gin reads a function's parameters to check and bind `train.<name>`: the
    # fields of TrainConfig, and **settings for the flat shorthands.
    params = [
        inspect.Parameter(
            "model_dir", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation="str | None"
        ),
        inspect.Parameter(
            "return_config", inspect.Parameter.KEYWORD_ONLY, default=False, annotation="bool"
        ),
    ]
    params += [
        inspect.Parameter(
            f.name, inspect.Parameter.KEYWORD_ONLY, default=f.default, annotation=f.type
        )
        for f in dataclasses.fields(TrainConfig)
    ]
    params.append(inspect.Parameter("settings", inspect.Parameter.VAR_KEYWORD, annotation="Any"))
    return inspect.Signature(params, return_annotation="TrainSummary | TrainConfig")


# A function object takes any attribute; typeshed's FunctionType declares no __signature__.
cast(Any, train).__signature__ = _train_signature()
