"""TPU slices as the TPU compiler (libtpu) describes them, on a host without a TPU.

`jax.experimental.topologies` turns a slice name ("v5e:4x4") into compile-only
devices, one per chip; `keras_moe.tpu_compile.compile_only` compiles over them.
This module names the generations, checks a slice name before libtpu is
loaded, and sets the environment libtpu needs on a CPU host.
"""

import functools
import importlib.util
import os
import re
from importlib.metadata import version

from keras_moe.training.errors import CompileOnlyError

# HBM per chip (GiB) by TPU generation, and the libtpu chip configuration a
# slice of that generation runs with: v4 and v5p chips have two TensorCores
# that JAX drives as one device ("megacore"); v5e and v6e chips have one.
GENERATIONS = {
    "v4": {"hbm_gib": 32, "chip_config": "megacore", "device_kind": "TPU v4"},
    "v5e": {"hbm_gib": 16, "chip_config": "default", "device_kind": "TPU v5 lite"},
    "v5p": {"hbm_gib": 95, "chip_config": "megacore", "device_kind": "TPU v5"},
    "v6e": {"hbm_gib": 32, "chip_config": "default", "device_kind": "TPU v6 lite"},
}
# Topologies this module is tested with (any "<generation>:<AxB[xC]>" of a known
# generation is accepted: 2-D for v5e/v6e, 3-D for v4/v5p, A and B 1 or even).
KNOWN_TOPOLOGIES = (
    "v5e:2x2",
    "v5e:2x4",
    "v5e:4x4",
    "v5e:8x8",
    "v6e:2x2",
    "v6e:4x4",
    "v6e:8x8",
    "v4:2x2x1",
    "v4:2x2x2",
    "v4:2x2x4",
    "v4:4x4x4",
    "v5p:2x2x1",
    "v5p:2x2x2",
    "v5p:4x4x4",
)
_TOPOLOGY_RE = re.compile(r"^(v4|v5e|v5p|v6e):(\d+(?:x\d+)+)$")
ALLOWED_FORMS = (
    "<generation>:AxB for v5e and v6e, <generation>:AxBxC for v4 and v5p, "
    "with A and B each 1 or even (a TPU host holds 2x2 chips)"
)


def setup_environment(environ=None):
    """Sets the environment a compile-only run needs; call before jax/keras are imported.

    Existing values are kept, except JAX_PLATFORMS, which must be "cpu" (the
    host computes nothing; a TPU backend would try to open a TPU).

    Example:
    >>> env = setup_environment({"JAX_PLATFORMS": "tpu"})
    >>> env["JAX_PLATFORMS"], env["KERAS_BACKEND"], env["TPU_WORKER_HOSTNAMES"]
    ('cpu', 'jax', 'localhost')
    """
    env = os.environ if environ is None else environ
    # ALLOW_MULTIPLE_LIBTPU_LOAD: libtpu otherwise takes /tmp/libtpu_lockfile and a
    # second compiling process (two test workers, two CLIs) aborts; no TPU is opened.
    defaults = {
        "KERAS_BACKEND": "jax",
        "TPU_SKIP_MDS_QUERY": "1",
        "TPU_WORKER_HOSTNAMES": "localhost",
        "TF_CPP_MIN_LOG_LEVEL": "3",
        "ALLOW_MULTIPLE_LIBTPU_LOAD": "1",
    }
    for key, value in defaults.items():
        if not env.get(key):
            env[key] = value
    env["JAX_PLATFORMS"] = "cpu"
    return env


def libtpu_missing_message():
    """None when libtpu is importable; else the error text with the install hint."""

    if importlib.util.find_spec("libtpu") is not None:
        return None
    try:
        jax_version = version("jax")
    except Exception:  # jax itself missing
        jax_version = "<your jax version>"
    return (
        "compiling for a TPU topology needs the TPU compiler (libtpu), which is not "
        'installed: pip install "keras-moe[tpu]" '
        f'(or pip install "jax[tpu]=={jax_version}"). '
        "Without it, compile for emulated CPU devices (--num_cpu_devices)."
    )


# Cloud TPU accelerator types (`gcloud ... --accelerator-type`, tpu_scripts/): v5e and
# v6e count chips, v4 and v5p TensorCores (two per chip).
_ACCELERATOR_TYPE_RE = re.compile(r"^(v4|v5litepod|v5e|v5p|v6e)-(\d+)$")
_CORES_PER_CHIP = {"v4": 2, "v5p": 2, "v5e": 1, "v6e": 1}


def canonical_topology(name):
    """`name` as "<generation>:<shape>": a Cloud TPU accelerator type ("v5litepod-8",
    "v4-32", "v5p-16", "v6e-64") becomes the slice shape it is; other names are
    returned stripped (`parse_topology` checks them).

    Example:
    >>> [canonical_topology(name) for name in ("v5litepod-8", "v4-32", "v5e:4x4")]
    ['v5e:2x4', 'v4:2x2x4', 'v5e:4x4']
    """
    text = str(name or "").strip()
    match = _ACCELERATOR_TYPE_RE.match(text)
    if not match:
        return text
    generation = "v5e" if match.group(1) == "v5litepod" else match.group(1)
    count = int(match.group(2))
    chips, rest = divmod(count, _CORES_PER_CHIP[generation])
    dims = [1, 1] if generation in ("v5e", "v6e") else [1, 1, 1]
    if chips >= 4:  # a host of 2x2 chips, then the smallest axis (the last of them) doubled
        dims[:2] = [2, 2]
        while dims[0] * dims[1] * (dims[2] if len(dims) == 3 else 1) < chips:
            smallest = min(dims)
            last = max(i for i, d in enumerate(dims) if d == smallest)
            dims[last] *= 2
    size = 1
    for d in dims:
        size *= d
    if rest or size != chips or chips & (chips - 1) or chips == 2:
        unit = "chips" if _CORES_PER_CHIP[generation] == 1 else "TensorCores (2 per chip)"
        raise CompileOnlyError(
            f"unknown Cloud TPU type {text!r}: {match.group(1)}-N takes N "
            f"{unit}, 1 or a power of two >= 4 chips (e.g. "
            f"{match.group(1)}-8)."
        )
    return f"{generation}:{'x'.join(str(d) for d in dims)}"


def parse_topology(name):
    """`(generation, chips, dims)` of a topology name such as "v5e:4x4" or "v4:2x2x2", or
    of a Cloud TPU accelerator type such as "v5litepod-8" (`canonical_topology`).

    Raises:
        CompileOnlyError: an unknown generation or a malformed shape (one line
            with the allowed forms and the known topologies).

    Example:
    >>> parse_topology("v5e:4x4")
    ('v5e', 16, (4, 4))
    """
    name = canonical_topology(name)
    match = _TOPOLOGY_RE.match(name)
    bad = CompileOnlyError(
        f"unknown TPU topology {name!r}: use {ALLOWED_FORMS}; generation one of "
        f"{sorted(GENERATIONS)}, e.g. one of {list(KNOWN_TOPOLOGIES)}."
    )
    if not match:
        raise bad
    generation, dims = match.group(1), tuple(int(d) for d in match.group(2).split("x"))
    if len(dims) != (3 if generation in ("v4", "v5p") else 2) or min(dims) < 1:
        raise bad
    # libtpu lays a slice out in hosts of 2x2 chips (`topology_devices`).
    if any(d != 1 and d % 2 for d in dims[:2]):
        raise bad
    chips = 1
    for d in dims:
        chips *= d
    return generation, chips, dims


@functools.lru_cache(maxsize=None)
def _topology_devices(name):
    generation, chips, dims = parse_topology(name)
    missing = libtpu_missing_message()
    if missing:
        raise CompileOnlyError(missing)
    from jax.experimental import topologies

    info = GENERATIONS[generation]
    # Hosts hold 2x2 chips (4 per TPU VM worker); smaller slices are one host.
    host = tuple(min(d, 2) for d in dims[:2]) + (1,)
    kwargs = {"chip_config_name": info["chip_config"], "chips_per_host_bounds": host}
    try:
        topology = topologies.get_topology_desc(topology_name=name, platform="tpu", **kwargs)
    except Exception as e:  # jax.errors.JaxRuntimeError: INVALID_ARGUMENT
        reason = str(e).strip().splitlines()[0]
        raise CompileOnlyError(
            f"libtpu refused the TPU topology {name!r} ({reason}): use {ALLOWED_FORMS}."
        ) from None
    devices = tuple(topology.devices)
    if len(devices) != chips:  # pragma: no cover - a libtpu that ignores chip_config_name
        raise CompileOnlyError(
            f"libtpu described {name} with {len(devices)} devices, expected {chips} (one per chip)."
        )
    return devices


def topology_devices(name):
    """The compile-only jax devices of the TPU slice `name` (one per chip); loads libtpu once."""
    return list(_topology_devices(name))
