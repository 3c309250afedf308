"""Several processes (one per host of a TPU pod slice) training one JAX mesh.

`initialize` starts JAX's distributed runtime before anything touches a
device: automatically on a Cloud TPU VM slice (or SLURM, Open MPI, Kubernetes)
with `--coordinator_address=auto`, or explicitly with a coordinator address,
the process count and this process's index. After it, `jax.devices()` lists
the devices of every process, the mesh spans them all, and each process feeds
its own rows of the global batch (`input_plan`).
"""

import os

import keras

from keras_moe.training.errors import TrainingConfigError
from keras_moe.validation import is_int


def add_flags(parser):
    """The multi-process flags of `keras-moe-train`."""
    group = parser.add_argument_group(
        "multi-process (KERAS_BACKEND=jax with a MeshPlacement; one process per host)"
    )
    group.add_argument(
        "--coordinator_address",
        default=None,
        metavar="HOST:PORT|auto",
        help="process 0's address for jax.distributed; 'auto' detects it "
        "(Cloud TPU VM slices, SLURM, Open MPI, Kubernetes)",
    )
    group.add_argument(
        "--process_count",
        type=int,
        default=None,
        help="number of processes (with an explicit --coordinator_address)",
    )
    group.add_argument(
        "--process_index",
        type=int,
        default=None,
        help="this process's index, 0 .. process_count - 1",
    )


def initialize(
    coordinator_address=None, process_count=None, process_index=None, backend=None, timeout_s=300
):
    """Starts `jax.distributed` when asked to; returns `(process_index, process_count)`.

    Args:
        coordinator_address: "host:port" of process 0, "auto", or None (one process).
        process_count, process_index: required with an explicit address.
        backend: the Keras backend (default `keras.backend.backend()`).
        timeout_s: seconds to wait for every process to join.

    Example:
    >>> initialize()  # nothing asked: one process
    (0, 1)
    """
    if coordinator_address is None:
        if process_count is not None or process_index is not None:
            raise TrainingConfigError(
                "--process_count/--process_index need --coordinator_address (HOST:PORT of "
                "process 0, or 'auto')."
            )
        return 0, 1
    if backend is None:
        backend = keras.backend.backend()
    if backend != "jax":
        raise TrainingConfigError(
            f"--coordinator_address starts JAX processes; on {backend!r} run several workers "
            'with StrategyPlacement.strategy = "multi_worker" (TF_CONFIG) instead, or use '
            "KERAS_BACKEND=jax."
        )
    # "auto": the cluster's environment fills in what is not given here.
    kwargs = dict(num_processes=process_count, process_id=process_index)
    if coordinator_address != "auto":
        if ":" not in coordinator_address:
            raise TrainingConfigError(
                f"--coordinator_address must be HOST:PORT or 'auto', got {coordinator_address!r}."
            )
        if not is_int(process_count) or process_count < 1:
            raise TrainingConfigError(
                f"--process_count must be an integer >= 1 with --coordinator_address="
                f"{coordinator_address}, got {process_count!r}."
            )
        if not is_int(process_index) or not 0 <= process_index < process_count:
            raise TrainingConfigError(
                f"--process_index must be an integer in [0, {process_count}), got "
                f"{process_index!r}."
            )
        kwargs["coordinator_address"] = coordinator_address
    import jax

    if os.environ.get("JAX_PLATFORMS", "") == "cpu":
        # CPU devices of different processes talk over TCP (gloo); without it
        # a cross-process collective fails at the first step.
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(initialization_timeout=timeout_s, **kwargs)
    return jax.process_index(), jax.process_count()


def process_info():
    """`(process_index, process_count)` of this run (1 process off JAX)."""

    if keras.backend.backend() != "jax":
        return 0, 1
    import jax

    return jax.process_index(), jax.process_count()


def input_plan(batch_size, input_shards, process_index, process_count):
    """Which input shards this process reads, and the rows it takes of each.

    The global batch is `input_shards` equal slices, slice i from
    `seqio.ShardInfo(i, input_shards)`; process p reads the consecutive shards
    `[p k, (p + 1) k)`, k = input_shards / process_count, so its rows are the
    p-th block of the global batch, as the mesh assigns them. Fixing
    `input_shards` keeps the stream the same for any number of processes.

    Args:
        batch_size: global batch (`BATCH_SIZE`).
        input_shards: `DatasetConfig.input_shards`; None: one per process.
        process_index, process_count: this process and the count.

    Returns:
        `(shard indices, input_shards, rows per shard)`.

    Example:
    >>> input_plan(16, None, 1, 2)  # process 1 of 2 reads shard 1 of 2
    ([1], 2, 8)
    >>> input_plan(16, 4, 0, 2)     # 4 shards over 2 processes
    ([0, 1], 4, 4)
    """
    shards = process_count if input_shards is None else input_shards
    if not is_int(shards) or shards < 1 or shards % process_count:
        raise TrainingConfigError(
            f"DatasetConfig.input_shards={input_shards!r} must be a positive multiple of the "
            f"{process_count} process(es)."
        )
    if batch_size % shards:
        raise TrainingConfigError(
            f"BATCH_SIZE={batch_size} must divide into DatasetConfig.input_shards={shards} equal "
            "slices."
        )
    per_process = shards // process_count
    first = process_index * per_process
    return list(range(first, first + per_process)), shards, batch_size // shards
