"""A run's data: which seqio task, at what lengths and batch, and this process's pipeline of it."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from keras_moe.training.errors import TrainingConfigError
from keras_moe.training.placement import multihost
from keras_moe.training.run import input_pipeline as data_lib
from keras_moe.validation import check_int

if TYPE_CHECKING:
    import tensorflow as tf


@dataclasses.dataclass
class DatasetConfig:
    """The training data of a run (gin: `train.dataset = @DatasetConfig()`).

    Validated once by `check`; `for_process` fixes which rows of every global
    batch this process reads; then `train_stream` and `split_pass` build its
    seqio pipelines.

    Args:
        task: seqio task or mixture name (`MIXTURE_OR_TASK_NAME`).
        feature_lengths: {"inputs": int, "targets": int} (`TASK_FEATURE_LENGTHS`);
            None: 128 / 32.
        batch_size: global batch size (`BATCH_SIZE`), split over the replicas
            or the mesh.
        pack: seqio packing of several examples into one row.
        shuffle: shuffle the training stream (seeded by `seed`).
        seed: seed of seqio's shuffles and random preprocessors (the run's
            global seed too).
        input_shards: the global batch is this many equal slices, each read
            from its own `seqio.ShardInfo` shard, the shards split over the JAX
            processes (see `multihost.input_plan`); None: one per process.
            Fixing it keeps the stream the same for any number of processes.

    Example:
    >>> data = DatasetConfig(batch_size=4, feature_lengths={"inputs": 32, "targets": 8})
    >>> data.check().for_process(0, 1).plan
    ([0], 1, 4)
    >>> inputs, targets, weights = next(iter(data.train_stream()))
    >>> tuple(targets.shape)
    (4, 8)
    >>> DatasetConfig(batch_size=0).check()
    Traceback (most recent call last):
    ...
    keras_moe.training.errors.TrainingConfigError: `DatasetConfig.batch_size` must be an integer >= 1, got 0.
    """  # noqa: E501 - verbatim output lines

    task: str = "embedded_span_corruption"
    feature_lengths: dict | None = None
    batch_size: int = 16
    pack: bool = True
    shuffle: bool = True
    seed: int = 0
    input_shards: int | None = None

    def __post_init__(self) -> None:
        # `(shard indices, input_shards, rows per shard)`, set by `for_process`.
        self.plan: tuple[list[int], int, int] | None = None

    def check(self) -> DatasetConfig:
        """Checks every setting without reading data; returns self.

        Raises:
            TrainingConfigError: naming the setting and what is allowed.
        """

        if self.feature_lengths is None:
            self.feature_lengths = {"inputs": 128, "targets": 32}
        data_lib.check_feature_lengths(self.feature_lengths)
        check_int("DatasetConfig.batch_size", self.batch_size, 1, TrainingConfigError)
        check_int("DatasetConfig.seed", self.seed, 0, TrainingConfigError)
        for name in ("pack", "shuffle"):
            if not isinstance(getattr(self, name), bool):
                raise TrainingConfigError(
                    f"DatasetConfig.{name} must be True or False, got {getattr(self, name)!r}."
                )
        if not isinstance(self.task, str) or not self.task:
            raise TrainingConfigError(
                f"DatasetConfig.task (MIXTURE_OR_TASK_NAME) must be a task or mixture name, "
                f"got {self.task!r}."
            )
        return self

    def for_process(self, process_index: int, process_count: int) -> DatasetConfig:
        """Fixes this process's input shards and rows of each global batch; returns self."""

        self.plan = multihost.input_plan(
            self.batch_size, self.input_shards, process_index, process_count
        )
        return self

    def check_task(self) -> None:
        """Fails on an unknown task or a task whose data is missing (no data is read)."""

        data_lib.get_task(self.task)
        data_lib.check_data(self.task)

    @property
    def tokens_per_batch(self) -> int:
        """Input and target tokens of one global batch."""
        lengths = self.feature_lengths
        assert lengths is not None, "DatasetConfig.check() first (it sets the default)"
        return self.batch_size * (lengths["inputs"] + lengths["targets"])

    def _process_dataset(self, split: str, **kwargs: Any):
        if self.plan is None:
            self.for_process(0, 1)
        return data_lib.make_process_dataset(
            self.task,
            self.feature_lengths,
            split,
            self.plan,
            pack=self.pack,
            seed=self.seed,
            **kwargs,
        )

    def train_stream(self, skip_batches: int = 0) -> tf.data.Dataset:
        """This process's training batches, repeated, the first `skip_batches` skipped."""
        return self._process_dataset(
            "train", shuffle=self.shuffle, repeat=True, skip_batches=skip_batches
        )

    def split_pass(self, split: str) -> tf.data.Dataset:
        """This process's batches of `split`, in order, once."""
        return self._process_dataset(split, shuffle=False, repeat=False)

    def summary_batches(self, split: str, count: int) -> tuple[tf.data.Dataset | None, str | None]:
        """`(finite dataset, split)` of `count` batches for the start/end loss, the
        validation curve and the expert-load plot: from `split`, or from the
        training stream when that split is missing; `(None, None)` when `count` is 0.
        """

        if not count:
            return None, None
        try:
            data = self.split_pass(split).take(count)
            data_lib.check_not_empty(data, "", split)
        except TrainingConfigError:
            data, split = self.train_stream().take(count), "train"
        return data_lib.finite(data), split
