"""The states of a model's `keras.random.SeedGenerator`s, as checkpoints record them.

Dropout, router jitter and random policies draw from seed generators: a seed
and a counter each, which neither weights format holds. A checkpoint records
them by where they sit in the model (`seed_states`), so a resumed run draws
the random numbers an uninterrupted one would have drawn.
"""

import re

import keras
import numpy as np

from keras_moe import compat
from keras_moe.training.checkpoint.checkpoint_names import (
    MISMATCH_HINT,
    SEED_STATES_FIELD,
    metadata_path,
)
from keras_moe.training.errors import CorruptCheckpointError, TrainingConfigError


def seed_states(model):
    """The state variables of `model`'s `keras.random.SeedGenerator`s, by where they sit.

    A state's own `.path` (`seed_generator_17/seed_generator_state`) counts all the
    generators made in the process, so it differs between two builds of one model. The
    key names the owning layers by class instead, numbered among their siblings as in
    `.weights.h5` files, e.g. `encoder_block_1/switch_feed_forward/switch_router/seed_generator`.

    Args:
        model: a Keras model (or layer).

    Returns:
        dict key -> state variable, in `model.variables` order.

    Example:
    >>> import keras
    >>> model = keras.Sequential([keras.Input((4,)), keras.layers.Dropout(0.1),
    ...                           keras.layers.Dense(2), keras.layers.Dropout(0.2)])
    >>> list(seed_states(model))
    ['dropout/seed_generator', 'dropout_1/seed_generator']
    """
    found = {}
    # Keras lists a layer's generators and sublayers only in private attributes (absent
    # from objects that merely have `save_weights`: they have no generators).
    _collect_seed_states(model, "", set(), found)
    return found


def _collect_seed_states(layer, prefix, seen, found):
    """Adds `layer`'s seed states under `prefix`, then its sublayers' (as `Layer.variables`).

    Args:
        layer: a Keras layer.
        prefix: the key of `layer`, "" or ending with "/".
        seen: ids of the states already found (a shared layer counts once).
        found: dict key -> state variable, filled in.
    """
    for i, generator in enumerate(compat.seed_generators(layer)):
        if id(generator.state) not in seen:
            seen.add(id(generator.state))
            found[prefix + _numbered("seed_generator", i)] = generator.state
    siblings = {}
    for child in compat.direct_sublayers(layer):
        name = _snake_case(type(child).__name__)
        siblings[name] = siblings.get(name, -1) + 1
        _collect_seed_states(child, f"{prefix}{_numbered(name, siblings[name])}/", seen, found)


def _numbered(name, index):
    return f"{name}_{index}" if index else name


def _snake_case(name):
    name = re.sub("(.)([A-Z][a-z]+)", r"\1_\2", name)
    return re.sub("([a-z])([A-Z])", r"\1_\2", name).lower()


def read_seed_states(model):
    """`{key: [seed, counter]}` of `model`'s seed generators (`seed_states`), as ints.

    Args:
        model: a Keras model whose variables hold the current state.
    """
    return {
        key: [int(x) for x in _host_value(variable).reshape(-1)]
        for key, variable in seed_states(model).items()
    }


def _host_value(variable):
    """`variable`'s value as NumPy. A JAX array spread over several processes is read
    through the shard this process holds: seed states are replicated."""
    value = variable.value
    if not getattr(value, "is_fully_addressable", True):
        value = value.addressable_shards[0].data
    return np.asarray(keras.ops.convert_to_numpy(value))


def _assign_host(variable, array):
    """Assigns the NumPy `array` to `variable`; a JAX variable keeps its sharding, which
    may span several processes (each builds the shards it holds)."""
    value = variable.value
    if hasattr(value, "addressable_shards"):
        import jax

        host = array
        array = jax.make_array_from_callback(host.shape, value.sharding, lambda index: host[index])
    variable.assign(array)


def restore_seed_states(model, meta):
    """Assigns the seed-generator states recorded in `meta` to `model`'s generators.

    Args:
        model: the model being restored.
        meta: the checkpoint's metadata; one without the field restores nothing.

    Raises:
        TrainingConfigError: the model's generators are not the checkpoint's.
        CorruptCheckpointError: a recorded state is malformed.
    """
    saved = meta.get(SEED_STATES_FIELD)
    if saved is None:
        return
    if not isinstance(saved, dict):
        raise CorruptCheckpointError(
            f"checkpoint {meta['path']}: its metadata {metadata_path(meta['path'])} holds "
            f"malformed seed states: {saved!r}."
        )
    states = seed_states(model)
    if set(saved) != set(states):
        raise TrainingConfigError(
            f"checkpoint {meta['path']} does not match this model's random seed generators "
            f"(dropout, router jitter): {_key_difference(states, saved)}. {MISMATCH_HINT}"
        )
    for key, variable in states.items():
        try:
            array = np.asarray(saved[key], dtype=variable.dtype).reshape(variable.shape)
        except (TypeError, ValueError, OverflowError):
            raise CorruptCheckpointError(
                f"checkpoint {meta['path']}: its metadata {metadata_path(meta['path'])} holds "
                f"a malformed seed state {key!r}: {saved[key]!r}."
            ) from None
        _assign_host(variable, array)


def _key_difference(states, saved):
    """A short account of how the model's seed-state keys differ from the saved ones."""
    parts = [f"the model has {len(states)}, the checkpoint {len(saved)}"]
    for what, keys in (
        ("only in the model", set(states) - set(saved)),
        ("only in the checkpoint", set(saved) - set(states)),
    ):
        if keys:
            parts.append(
                f"{what}: {', '.join(sorted(keys)[:3])}"
                + (f" and {len(keys) - 3} more" if len(keys) > 3 else "")
            )
    return "; ".join(parts)
