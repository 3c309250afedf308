"""File names and metadata fields of `ckpt-<step>` checkpoints (`keras_moe.training.checkpoint`)."""

import re

META_NAME = re.compile(r"^ckpt-(\d+)\.json$")
WEIGHTS_SUFFIXES = (".weights.h5", ".orbax")
SEED_STATES_FIELD = "seed_states"  # the metadata field of the seed-generator states
MISMATCH_HINT = (
    "Use a fresh --model_dir, or the gin config the checkpoint was trained with "
    "(its operative_config.gin)."
)


def metadata_path(path):
    """The metadata file of the weights `path`."""
    for suffix in WEIGHTS_SUFFIXES:
        if path.endswith(suffix):
            return path[: -len(suffix)] + ".json"
    return path
