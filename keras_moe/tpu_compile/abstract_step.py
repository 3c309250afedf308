"""A train step's model, optimizer state and batch as sharded shapes, never values.

A compile-only client (`jax.experimental.topologies`) cannot hold a value, so
`keras_moe.tpu_compile.compile_only` builds the job's model and optimizer under
`keras.StatelessScope` / `jax.eval_shape` and lowers `model.train_step` over
these abstract arguments.
"""

import keras
import numpy as np

from keras_moe import compat, models
from keras_moe.parallel import abstract_arrays
from keras_moe.training.run.dtype_policy import dtype_policy_scope


def _bytes(shape, dtype):
    return int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize


def abstract_model(config, distribution, train_configurables, dtype_policy):
    """The job's model, compiled, and its built optimizer: variables of shapes and layouts only."""
    import jax

    # Variables created in this scope get a shape and a layout, never a value:
    # a compile-only client cannot hold one.
    with dtype_policy_scope(dtype_policy), keras.StatelessScope(initialize_variables=False):
        model = models.build_model(config)
    for variable in model.variables:
        # What initialising the variable would do; the optimizer's slots take
        # their reference weight's layout from it (as in training).
        compat.set_variable_layout(variable, distribution.get_variable_layout(variable))
    built = {}

    # The optimizer (its step counter, Adafactor's factored moments) and the
    # compiled metrics create variables from values: make them under
    # eval_shape, so those values are traced, never computed or placed.
    def build():
        built["optimizer"] = optimizer = train_configurables.make_optimizer()  # the job's bindings
        model.compile(**model.compile_defaults(optimizer=optimizer, jit_compile=True))
        optimizer.build(model.trainable_variables)

    jax.eval_shape(build)
    return model, built["optimizer"]


def abstract_state(model, optimizer, distribution):
    """The train step's state as sharded abstract arrays, and each part's bytes per chip."""
    parts = {
        "param": model.trainable_variables,
        "non_trainable": model.non_trainable_variables,
        "optimizer": optimizer.variables,
        "metrics": model.metrics_variables,
    }
    state, sizes = [], {}
    for name, variables in parts.items():
        arrays = abstract_arrays.abstract_variables(variables, distribution)
        state.append(arrays)
        sizes[f"{name}_bytes"] = sum(
            _bytes(a.sharding.shard_shape(a.shape), a.dtype) for a in arrays
        )
    return tuple(state), sizes
