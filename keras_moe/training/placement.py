"""Where a run's model lives: a `tf.distribute` strategy or a JAX device mesh, behind one interface.

A run file picks one (`train.placement = @StrategyPlacement()` or
`@MeshPlacement()`); the `Run` asks it, after `start`, for the scope to build
the model in, the replicas the global batch is split over, whether this
process is the chief (it writes checkpoints, logs and plots), how the weights
were sharded, and what a failed collective means. The `Run` never reads the
strategy's name.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, ContextManager

from keras_moe.training.errors import TrainingConfigError
from keras_moe.training.log import log
from keras_moe.validation import is_number

if TYPE_CHECKING:
    import keras


class StrategyPlacement:
    """Data parallelism by a `tf.distribute` strategy.

    Args:
        strategy: "default" (one device), "mirrored", "multi_worker" or "tpu"
            (see `keras_moe.training.strategy`).
        tpu_name: for "tpu": "local" on a TPU VM, or a TPU name.
        devices: for "mirrored": the devices (default: all local GPUs, or the CPU).
        collective_timeout: "multi_worker": seconds after which a stuck
            collective (e.g. a dead peer) fails the step instead of hanging
            (None: no limit).
        cluster_wait_timeout: "multi_worker": seconds to wait for all workers
            at start (None: forever).

    Example:
    >>> placement = StrategyPlacement().check().start()
    >>> placement.describe(), placement.chief, placement.replicas
    ('strategy default (_DefaultDistributionStrategy, 1 replica(s))', True, 1)
    >>> StrategyPlacement("mirrord").check()
    Traceback (most recent call last):
    ...
    keras_moe.training.errors.TrainingConfigError: StrategyPlacement.strategy must be one of ('default', 'mirrored', 'multi_worker', 'tpu'), got 'mirrord'.
    """  # noqa: E501 - verbatim output lines

    mesh = None

    def __init__(self, strategy: str = "default", tpu_name: str | None = None,
                 devices: list | None = None, collective_timeout: float | None = 600,
                 cluster_wait_timeout: float | None = 600):
        self.name, self.tpu_name, self.devices = strategy, tpu_name, devices
        self.collective_timeout = collective_timeout
        self.cluster_wait_timeout = cluster_wait_timeout
        self.strategy = self.replicas = self.chief = None

    def check(self, batch_size: int | None = None) -> StrategyPlacement:
        """Checks the settings (no device is touched); returns self."""
        from keras_moe.training.strategy import STRATEGIES

        if self.name not in STRATEGIES:
            raise TrainingConfigError(
                f"StrategyPlacement.strategy must be one of {STRATEGIES}, got {self.name!r}.")
        for name in ("collective_timeout", "cluster_wait_timeout"):
            value = getattr(self, name)
            if value is not None and (not is_number(value) or value <= 0):
                raise TrainingConfigError(
                    f"`StrategyPlacement.{name}` must be a positive number of seconds or None, "
                    f"got {value!r}.")
        return self

    def start(self, process_index: int = 0) -> StrategyPlacement:
        """Makes the strategy (connects to the TPU or the workers); returns self."""
        from keras_moe.training import strategy as strategy_lib

        self.strategy = strategy_lib.make_strategy(
            self.name, tpu_name=self.tpu_name, devices=self.devices,
            collective_timeout=self.collective_timeout,
            cluster_wait_timeout=self.cluster_wait_timeout)
        self.replicas = self.strategy.num_replicas_in_sync
        self.chief = strategy_lib.is_chief(self.strategy) and process_index == 0
        return self

    def check_batch(self, batch_size: int) -> None:
        """Refuses a global batch the replicas cannot share equally."""
        if batch_size % self.replicas:
            raise TrainingConfigError(
                f"BATCH_SIZE={batch_size} is not divisible by the {self.replicas} replicas "
                f"of StrategyPlacement.strategy={self.name!r}.")

    def apply(self) -> None:
        """Nothing to set before the model is built."""

    def scope(self) -> ContextManager:
        """The strategy's scope: variables made inside are mirrored over its replicas."""
        return self.strategy.scope()

    def shard_report(self, model: keras.Model) -> None:
        """None: a strategy replicates every weight."""
        return None

    def exchange_report(self, model: keras.Model, batch_size: int,
                        feature_lengths: dict) -> list[str]:
        """No lines: each replica routes its own batch to its own copy of every expert."""
        return []

    def batch_layout(self, batch_size: int) -> str:
        """How the global batch is split, for the start-up report."""
        return f"global batch {batch_size} = {batch_size // self.replicas} per replica"

    def describe(self) -> str:
        return f"strategy {self.name} ({type(self.strategy).__name__}, {self.replicas} replica(s))"

    def shared_with(self, process_count: int) -> str | None:
        """Who else holds the model ("multi_worker"), or None: the chief alone can
        run a pass over it (the expert-load plot)."""
        if process_count > 1:
            return f"{process_count} processes"
        return "multi_worker" if self.name == "multi_worker" else None

    def peer_failure(self, error: Exception, step: int) -> Exception | None:
        """The error to raise instead of a failed collective `error` at `step`:
        under "multi_worker" a `WorkerFailureError` that says how to resume; None
        (raise `error` itself) otherwise."""
        import tensorflow as tf

        peer_errors = (tf.errors.UnavailableError, tf.errors.DeadlineExceededError,
                       tf.errors.CancelledError, tf.errors.AbortedError)
        if self.name != "multi_worker" or not isinstance(error, peer_errors):
            return None
        from keras_moe.training.errors import WorkerFailureError

        text = str(error).strip()
        first_line = text.splitlines()[0] if text else type(error).__name__
        return WorkerFailureError(
            f"multi_worker: a collective failed at step {step} ({type(error).__name__}: "
            f"{first_line[:300]}); a peer worker probably died or is unreachable "
            f"(collective_timeout={self.collective_timeout} s). Restart all workers with the "
            "same command to resume from the last checkpoint.")


class MeshPlacement:
    """Weights and batches sharded over a `keras.distribution` device mesh (JAX backend).

    Args:
        mesh_shape: dict mesh axis -> size, e.g. {"data": 2, "expert": 4}
            (see `keras_moe.sharding.configure_mesh`).
        logical_axis_rules: `(logical axis, mesh axes)` pairs, or None for
            `keras_moe.layouts.DEFAULT_RULES`.
    """

    replicas = 1  # one program over the whole mesh; the mesh splits the batch
    name = "default"  # no tf.distribute strategy

    def __init__(self, mesh_shape: dict | None = None, logical_axis_rules: tuple | None = None):
        self.mesh_shape, self.logical_axis_rules = mesh_shape, logical_axis_rules
        self.chief = None
        self.mesh = None

    def check(self, batch_size: int | None = None) -> MeshPlacement:
        """Checks the mesh against this backend and its devices, and that
        `batch_size` splits over it; returns self."""
        from keras_moe.training import mesh as mesh_lib

        if self.mesh_shape is None:
            raise TrainingConfigError(
                'MeshPlacement.mesh_shape is required, e.g. {"data": 2, "expert": 4}.')
        mesh_lib.check_mesh(self.mesh_shape, self.logical_axis_rules)
        if batch_size is not None:
            mesh_lib.check_batch_splits(self.mesh_shape, self.logical_axis_rules, batch_size)
        return self

    def start(self, process_index: int = 0) -> MeshPlacement:
        """Process 0 is the chief; returns self."""
        self.chief = process_index == 0
        return self

    def check_batch(self, batch_size: int) -> None:
        """The mesh's split of the batch was checked by `check`."""

    def apply(self) -> None:
        """Sets the mesh as Keras' distribution; must come before any layer is made."""
        from keras_moe.training import mesh as mesh_lib

        self.mesh = mesh_lib.apply_mesh(self.mesh_shape, self.logical_axis_rules)
        log(f"device mesh {self.mesh}: the model is sharded by keras_moe.layouts")

    def scope(self) -> ContextManager:
        """No scope: the distribution set by `apply` places every variable."""
        return contextlib.nullcontext()

    def shard_report(self, model: keras.Model) -> list:
        """[(class of variable, full shape, shape on one device)] (`mesh.shard_report`)."""
        from keras_moe.training import mesh as mesh_lib

        return mesh_lib.shard_report(model)

    def exchange_report(self, model: keras.Model, batch_size: int,
                        feature_lengths: dict) -> list[str]:
        """Lines naming each MoE layer's expert exchange and why (`mesh.exchange_report`)."""
        from keras_moe.training import mesh as mesh_lib

        return mesh_lib.exchange_report(model, batch_size, feature_lengths)

    def batch_layout(self, batch_size: int) -> str:
        """How the global batch is split over the mesh, for the start-up report."""
        from keras_moe.training import mesh as mesh_lib

        axes, size = mesh_lib.batch_split(self.mesh_shape, self.logical_axis_rules, batch_size)
        if size == 1:
            return f"global batch {batch_size}, not split over the mesh"
        return (f"global batch {batch_size} split over mesh axes {' x '.join(axes)} = {size} "
                f"devices, {batch_size // size} rows each")

    def describe(self) -> str:
        return f"device mesh {self.mesh_shape} (keras.distribution)"

    def shared_with(self, process_count: int) -> str | None:
        """"N processes" when the sharded model spans several, else None."""
        return f"{process_count} processes" if process_count > 1 else None

    def peer_failure(self, error: Exception, step: int) -> None:
        """None: a mesh's failed step is raised as it is."""
        return None
