"""The weights and optimizer state of a model sharded over JAX processes, in an Orbax folder.

Every process writes the shards it holds and reads back the shards its
variables hold now, so a checkpoint moves between meshes and process counts.
`checkpoint.CheckpointManager(sharded=True)` commits these folders with the
same json metadata as `.weights.h5` files, which also holds the states of the
model's seed generators (`checkpoint.seed_states`).
"""

import os

import numpy as np


def saved_variables(model):
    """What a checkpoint holds, as `model.save_weights` does: weights and optimizer state
    (the seed generators' states go in its json metadata)."""
    return {
        "model": model.weights,
        "optimizer": model.optimizer.variables if model.optimizer is not None else [],
    }


def _key(index):
    # Keyed by position like a .weights.h5 file (Keras's state tree keys by variable name,
    # which Adafactor's placeholder variables repeat).
    return f"{index:06d}"


def save(model, path):
    """Writes `model`'s state to the Orbax folder `path` (every process calls it).

    Orbax's folder appears complete or not at all; an existing folder at `path`
    (an uncommitted save of the same step, before a crash) is replaced.
    """
    import jax
    import orbax.checkpoint as ocp

    def array(variable):  # JAX arrays keep their sharding; other backends' values go as NumPy
        value = variable.value
        return value if isinstance(value, jax.Array) else np.asarray(variable.numpy())

    state = {
        group: {_key(i): array(v) for i, v in enumerate(variables)}
        for group, variables in saved_variables(model).items()
    }
    ocp.v1.save(path, state, overwrite=True)


def restore(model, path):
    """Reads the Orbax folder `path` into `model`, each array straight into its
    variable's current sharding (any mesh, any number of processes).

    Example:
    >>> import os, tempfile
    >>> import keras, numpy as np
    >>> model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
    >>> model.compile("adam", "mse")
    >>> model.optimizer.build(model.trainable_variables)
    >>> path = os.path.join(tempfile.mkdtemp(), "ckpt-00000001.orbax")
    >>> save(model, path)
    >>> saved = model.weights[0].numpy().copy()
    >>> _ = model.weights[0].assign(np.zeros((4, 2)))
    >>> restore(model, path)
    >>> bool(np.array_equal(model.weights[0].numpy(), saved))
    True
    """
    import jax
    import orbax.checkpoint as ocp

    host = jax.sharding.SingleDeviceSharding(jax.local_devices(backend="cpu")[0])

    def target(variable):  # other backends' variables are read via one host array
        value = variable.value
        sharding = value.sharding if isinstance(value, jax.Array) else host
        return jax.ShapeDtypeStruct(variable.shape, variable.dtype, sharding=sharding)

    groups = saved_variables(model)
    abstract = {
        group: {_key(i): target(v) for i, v in enumerate(variables)}
        for group, variables in groups.items()
    }
    loaded = ocp.v1.load(path, abstract)
    for group, variables in groups.items():
        for i, variable in enumerate(variables):
            value = loaded[group][_key(i)]
            variable.assign(value if isinstance(variable.value, jax.Array) else np.asarray(value))


def folder_size(path):
    """Bytes of the files under `path`."""
    return sum(
        os.path.getsize(os.path.join(root, name))
        for root, _, names in os.walk(path)
        for name in names
    )
