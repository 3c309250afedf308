"""The model of a factory, compiled with its own loss and metrics and the run's optimizer."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import keras

from keras_moe.training.errors import TrainingConfigError
from keras_moe.training.run import schedules

if TYPE_CHECKING:
    import keras


def build_compiled_model(
    optimizer: Any = None,
    jit_compile: bool | str = "auto",
    steps_per_execution: int = 1,
    model: Callable[[], keras.Model] | None = None,
) -> keras.Model:
    """The model of the factory `model` (default: gin's `build_model`,
    `keras_moe.gin_config.model_configurables.build_model`), compiled with its
    `compile_defaults` (T5: the T5 loss).

    Args:
        optimizer: a Keras optimizer, or a factory of one called here (so under
            the caller's strategy scope); None: `make_optimizer()` with its
            own defaults (run files bind `train.optimizer = @make_optimizer`).
        jit_compile, steps_per_execution: as for `Model.compile`.
        model: a factory of the uncompiled model, e.g. gin's `@build_model` or
            `@build_distiller`.
    """

    if model is None:
        from keras_moe.gin_config import model_configurables

        model = model_configurables.build_model
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
