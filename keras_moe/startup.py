"""Known-harmless start-up chatter of TensorFlow and its stack, filtered from stderr.

On a machine without a GPU, importing TensorFlow prints a CUDA-driver note and
absl's pre-initialisation banner straight to file descriptor 2 (C++ logging,
which `TF_CPP_MIN_LOG_LEVEL` does not reach), and the first device probe logs
a failed `cuInit`. `filtered_stderr` captures descriptor 2 and writes back
every other line, so real errors still show. Only keras_moe's own
command-line tools filter (`launched_as_command`); importing keras_moe from
anything else leaves the process's stderr alone.
"""

from __future__ import annotations

import contextlib
import glob
import os
import re
import sys
import tempfile
from collections.abc import Iterator, MutableMapping, Sequence

from keras_moe.log_filters import drop_harmless_log_messages

# A machine with an NVIDIA driver loaded has this; there a failed CUDA probe is news.
NVIDIA_DRIVER_PATH = "/proc/driver/nvidia"

NO_GPU_NOISE = (
    re.compile(r"cudart_stub\.cc.*Could not find cuda drivers"),
    re.compile(r"failed call to cuInit"),
)

# libtpu, loaded for its compiler on a host without a TPU (keras-moe-compile),
# looks for the TPU VM's accelerator type and says it found none.
NO_TPU_NOISE = (
    re.compile(r"could not determine TPU accelerator type"),
    re.compile(r"Logging before InitGoogle\(\) is written to STDERR"),
)

STARTUP_NOISE = (
    re.compile(r"All log messages before absl::InitializeLog\(\) is called"),
    re.compile(r"cpu_feature_guard\.cc.*This TensorFlow binary is optimized"),
    re.compile(r"^To enable the following instructions: .* rebuild TensorFlow"),
    re.compile(r"oneDNN custom operations are on"),
    re.compile(r"Unable to register cu(DNN|FFT|BLAS) factory"),
    re.compile(r"computation placer already registered"),
)


def is_startup_noise(line: str) -> bool:
    """True for a known-harmless start-up line (the CUDA probe's failure only
    where no NVIDIA driver is loaded).

    Example:
    >>> is_startup_noise("I0000 00:00:17 1 cpu_feature_guard.cc:227] This TensorFlow binary "
    ...                  "is optimized to use available CPU instructions")
    True
    >>> is_startup_noise("E0000 00:00:17 1 some_op.cc:1] Out of memory")
    False
    """
    patterns: tuple[re.Pattern[str], ...] = STARTUP_NOISE
    if not os.path.exists(NVIDIA_DRIVER_PATH):
        patterns += NO_GPU_NOISE
    if not host_has_tpu():
        patterns += NO_TPU_NOISE
    return any(p.search(line) for p in patterns)


# Google's PCI vendor id: a TPU VM's chips are Google PCI devices (what jax's
# own Cloud TPU detection looks for); /dev/accel* (v4) and /dev/vfio (v5e and
# later) are how the TPU runtime opens them.
GOOGLE_PCI_VENDOR = "0x1ae0"


def host_has_tpu(root: str = "/") -> bool:
    """True when this host has a TPU chip attached (or a device that may be one).

    Example:
    >>> host_has_tpu(root="/nonexistent")
    False
    """
    for vendor in glob.glob(os.path.join(root, "sys/bus/pci/devices/*/vendor")):
        try:
            with open(vendor) as f:
                if f.read().strip() == GOOGLE_PCI_VENDOR:
                    return True
        except OSError:
            continue
    return bool(
        glob.glob(os.path.join(root, "dev/accel*"))
        or os.path.exists(os.path.join(root, "dev/vfio"))
    )


def jax_on_cpu_without_accelerator(
    environ: MutableMapping[str, str] | None = None, root: str = "/"
) -> bool:
    """Sets JAX_PLATFORMS=cpu when it is unset and the host has neither a TPU nor a GPU.

    With libtpu installed (the `tpu` extra), jax's default platform list
    makes it start the TPU runtime on every host; without a TPU that prints
    libtpu errors ("could not determine TPU accelerator type", "unexpected
    worker hostname") before falling back to the CPU. Naming the CPU skips
    the probe and changes nothing else there. A JAX_PLATFORMS that is set, or
    JAX_FORCE_TPU_INIT / TPU_ACCELERATOR_TYPE (a TPU wanted), is left alone;
    so is a host with an accelerator (or what may be one). Also applied to an
    already imported jax whose backends are not started.

    Returns:
        True when it set JAX_PLATFORMS.

    Example:
    >>> env = {}
    >>> jax_on_cpu_without_accelerator(env, root="/nonexistent"), env.get("JAX_PLATFORMS")
    (True, 'cpu')
    >>> jax_on_cpu_without_accelerator({"JAX_PLATFORMS": "tpu"}, root="/nonexistent")
    False
    """
    env = os.environ if environ is None else environ
    if env.get("JAX_PLATFORMS") or env.get("JAX_FORCE_TPU_INIT") or env.get("TPU_ACCELERATOR_TYPE"):
        return False
    accelerator = (
        host_has_tpu(root)
        or os.path.exists(os.path.join(root, NVIDIA_DRIVER_PATH[1:]))
        or os.path.exists(os.path.join(root, "dev/kfd"))
    )  # kfd: an AMD GPU
    if accelerator:
        return False
    env["JAX_PLATFORMS"] = "cpu"
    jax = sys.modules.get("jax") if environ is None else None
    if jax is not None:
        try:
            if jax.config.jax_platforms is None:
                jax.config.update("jax_platforms", "cpu")
        except Exception:  # backends already started: too late, harmless
            pass
    return True


@contextlib.contextmanager
def filtered_stderr() -> Iterator[None]:
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
            kept = [
                line
                for line in capture.read().decode("utf-8", "replace").splitlines(True)
                if not is_startup_noise(line)
            ]
            if kept:
                sys.stderr.write("".join(kept))
                sys.stderr.flush()


COMMANDS = ("keras-moe-train", "keras-moe-eval", "keras-moe-distill", "keras-moe-compile")


def launched_as_command(
    argv: Sequence[str] | None = None, orig_argv: Sequence[str] | None = None
) -> bool:
    """True in a process started as a keras_moe command: one of `COMMANDS`, or
    `python -m keras_moe...`.

    Example:
    >>> launched_as_command(["/venv/bin/keras-moe-train", "--model_dir=x"], [])
    True
    >>> launched_as_command(["-m"], ["python", "-m", "keras_moe.training", "--model_dir=x"])
    True
    >>> launched_as_command(["-c"], ["python", "-c", "import keras_moe"])
    False
    """
    argv = sys.argv if argv is None else argv
    orig_argv = getattr(sys, "orig_argv", []) if orig_argv is None else orig_argv
    if argv and os.path.basename(argv[0]) in COMMANDS:
        return True
    for flag, module in zip(orig_argv, orig_argv[1:], strict=False):
        if flag == "-m":
            return module == "keras_moe" or module.startswith("keras_moe.")
    return False


def import_keras_quietly() -> None:
    """Imports Keras (and so its backend) with `filtered_stderr`, unless
    it is already imported."""
    if "keras" not in sys.modules:
        with filtered_stderr():
            import keras  # noqa: F401, PLC0415  (its import-time output is filtered here)


def quiet_startup() -> None:
    """Imports TensorFlow, seqio and the tasks and probes the devices with
    start-up noise filtered; silences `log_filters.HARMLESS_LOG_MESSAGES`. Idempotent.
    The command-line tools call it first thing (Keras itself was imported
    quietly by `keras_moe/__init__`, see `launched_as_command`)."""
    with filtered_stderr():
        import tensorflow as tf

        from keras_moe import tasks  # noqa: F401  (seqio, jax, tensorflow-text)

        tf.config.list_physical_devices()
    drop_harmless_log_messages()
