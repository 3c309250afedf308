"""A run's output folder: created if needed, refused when it cannot hold checkpoints."""

import os
import tempfile

from keras_moe.training.errors import TrainingConfigError


def prepare_model_dir(model_dir: str | None) -> str:
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
