"""`StrategyPlacement`: a run's model replicated by a `tf.distribute` strategy."""

from __future__ import annotations

from typing import TYPE_CHECKING, ContextManager

from keras_moe.training.errors import TrainingConfigError, WorkerFailureError
from keras_moe.training.placement import strategy as strategy_lib
from keras_moe.training.placement.strategy import STRATEGIES
from keras_moe.validation import is_number

if TYPE_CHECKING:
    import keras
    import tensorflow as tf


class StrategyPlacement:
    """Data parallelism by a `tf.distribute` strategy.

    Args:
        strategy: "default" (one device), "mirrored", "multi_worker" or "tpu"
            (see `keras_moe.training.placement.strategy`).
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

    def __init__(
        self,
        strategy: str = "default",
        tpu_name: str | None = None,
        devices: list | None = None,
        collective_timeout: float | None = 600,
        cluster_wait_timeout: float | None = 600,
    ):
        self.name, self.tpu_name, self.devices = strategy, tpu_name, devices
        self.collective_timeout = collective_timeout
        self.cluster_wait_timeout = cluster_wait_timeout
        # Set by `start`.
        self.strategy: tf.distribute.Strategy | None = None
        self.replicas: int | None = None
        self.chief: bool | None = None

    def check(self, batch_size: int | None = None) -> StrategyPlacement:
        """Checks the settings (no device is touched); returns self."""

        if self.name not in STRATEGIES:
            raise TrainingConfigError(
                f"StrategyPlacement.strategy must be one of {STRATEGIES}, got {self.name!r}."
            )
        for name in ("collective_timeout", "cluster_wait_timeout"):
            value = getattr(self, name)
            if value is not None and (not is_number(value) or value <= 0):
                raise TrainingConfigError(
                    f"`StrategyPlacement.{name}` must be a positive number of seconds or None, "
                    f"got {value!r}."
                )
        return self

    def start(self, process_index: int = 0) -> StrategyPlacement:
        """Makes the strategy (connects to the TPU or the workers); returns self."""

        self.strategy = strategy_lib.make_strategy(
            self.name,
            tpu_name=self.tpu_name,
            devices=self.devices,
            collective_timeout=self.collective_timeout,
            cluster_wait_timeout=self.cluster_wait_timeout,
        )
        self.replicas = self.strategy.num_replicas_in_sync
        self.chief = strategy_lib.is_chief(self.strategy) and process_index == 0
        return self

    def check_batch(self, batch_size: int) -> None:
        """Refuses a global batch the replicas cannot share equally."""
        assert self.replicas is not None, "StrategyPlacement.start() first"
        if batch_size % self.replicas:
            raise TrainingConfigError(
                f"BATCH_SIZE={batch_size} is not divisible by the {self.replicas} replicas "
                f"of StrategyPlacement.strategy={self.name!r}."
            )

    def apply(self) -> None:
        """Nothing to set before the model is built."""

    def scope(self) -> ContextManager:
        """The strategy's scope: variables made inside are mirrored over its replicas."""
        assert self.strategy is not None, "StrategyPlacement.start() first"
        return self.strategy.scope()

    def shard_report(self, model: keras.Model) -> None:
        """None: a strategy replicates every weight."""
        return None

    def exchange_report(
        self, model: keras.Model, batch_size: int, feature_lengths: dict
    ) -> list[str]:
        """No lines: each replica routes its own batch to its own copy of every expert."""
        return []

    def batch_layout(self, batch_size: int) -> str:
        """How the global batch is split, for the start-up report."""
        assert self.replicas is not None, "StrategyPlacement.start() first"
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

        peer_errors = (
            tf.errors.UnavailableError,
            tf.errors.DeadlineExceededError,
            tf.errors.CancelledError,
            tf.errors.AbortedError,
        )
        if self.name != "multi_worker" or not isinstance(error, peer_errors):
            return None

        text = str(error).strip()
        first_line = text.splitlines()[0] if text else type(error).__name__
        return WorkerFailureError(
            f"multi_worker: a collective failed at step {step} ({type(error).__name__}: "
            f"{first_line[:300]}); a peer worker probably died or is unreachable "
            f"(collective_timeout={self.collective_timeout} s). Restart all workers with the "
            "same command to resume from the last checkpoint."
        )
