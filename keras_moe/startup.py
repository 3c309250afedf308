"""Known-harmless start-up chatter of TensorFlow and its stack, filtered from stderr.

On a machine without a GPU, importing TensorFlow prints a CUDA-driver note and
absl's pre-initialisation banner straight to file descriptor 2 (C++ logging,
which `TF_CPP_MIN_LOG_LEVEL` does not reach), and the first device probe logs
a failed `cuInit`. `filtered_stderr` captures descriptor 2 and writes back
every other line, so real errors still show.
"""

import contextlib
import os
import re
import sys
import tempfile

# A machine with an NVIDIA driver loaded has this; there a failed CUDA probe is news.
NVIDIA_DRIVER_PATH = "/proc/driver/nvidia"

NO_GPU_NOISE = (
    re.compile(r"cudart_stub\.cc.*Could not find cuda drivers"),
    re.compile(r"failed call to cuInit"),
)

STARTUP_NOISE = (
    re.compile(r"All log messages before absl::InitializeLog\(\) is called"),
    re.compile(r"cpu_feature_guard\.cc.*This TensorFlow binary is optimized"),
    re.compile(r"^To enable the following instructions: .* rebuild TensorFlow"),
    re.compile(r"oneDNN custom operations are on"),
    re.compile(r"Unable to register cu(DNN|FFT|BLAS) factory"),
    re.compile(r"computation placer already registered"),
)


def is_startup_noise(line):
    """True for a known-harmless start-up line (the CUDA probe's failure only
    where no NVIDIA driver is loaded).

    Example:
    >>> is_startup_noise("I0000 00:00:17 1 cpu_feature_guard.cc:227] This TensorFlow binary "
    ...                  "is optimized to use available CPU instructions")
    True
    >>> is_startup_noise("E0000 00:00:17 1 some_op.cc:1] Out of memory")
    False
    """
    patterns = STARTUP_NOISE
    if not os.path.exists(NVIDIA_DRIVER_PATH):
        patterns += NO_GPU_NOISE
    return any(p.search(line) for p in patterns)


@contextlib.contextmanager
def filtered_stderr():
    """Captures file descriptor 2 (C++ and Python writes alike) and writes
    back the lines that are not `is_startup_noise`, also when the body raises."""
    sys.stderr.flush()
    try:
        saved = os.dup(2)
    except OSError:  # no descriptor 2 (some embedded interpreters): nothing to filter
        yield
        return
    with tempfile.TemporaryFile(mode="w+b") as capture:
        os.dup2(capture.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            capture.seek(0)
            kept = [line for line in capture.read().decode("utf-8", "replace").splitlines(True)
                    if not is_startup_noise(line)]
            if kept:
                sys.stderr.write("".join(kept))
                sys.stderr.flush()


def import_keras_quietly():
    """Imports Keras (and so its backend) with `filtered_stderr`, unless
    it is already imported."""
    if "keras" not in sys.modules:
        with filtered_stderr():
            import keras  # noqa: F401
