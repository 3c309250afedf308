"""A training run's settings: its collaborators (data, checkpoints, placement), the loop's own."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from keras_moe.models.routing_mode import EVAL_ROUTINGS
from keras_moe.training.checkpoint.checkpoint_config import CheckpointConfig
from keras_moe.training.errors import TrainingConfigError
from keras_moe.training.placement import MeshPlacement, StrategyPlacement
from keras_moe.training.run.dataset_config import DatasetConfig
from keras_moe.training.run.dtype_policy import check_dtype_policy
from keras_moe.validation import check_int

# Flat settings of earlier run files -> (the collaborator, its field). `train`
# still takes them when that collaborator is not bound.
SHORTHANDS = {
    "task": ("dataset", "task"),
    "feature_lengths": ("dataset", "feature_lengths"),
    "batch_size": ("dataset", "batch_size"),
    "pack": ("dataset", "pack"),
    "shuffle": ("dataset", "shuffle"),
    "seed": ("dataset", "seed"),
    "input_shards": ("dataset", "input_shards"),
    "checkpoint_every": ("checkpoint", "every"),
    "keep_checkpoints": ("checkpoint", "keep"),
    "backup_every": ("checkpoint", "backup_every"),
    "init_checkpoint": ("checkpoint", "init_checkpoint"),
    "strategy": ("placement", "strategy"),
    "tpu_name": ("placement", "tpu_name"),
    "mirrored_devices": ("placement", "devices"),
    "collective_timeout": ("placement", "collective_timeout"),
    "cluster_wait_timeout": ("placement", "cluster_wait_timeout"),
    "mesh_shape": ("placement", "mesh_shape"),
    "logical_axis_rules": ("placement", "logical_axis_rules"),
}
_CLASS_OF = {"dataset": "DatasetConfig", "checkpoint": "CheckpointConfig"}
_MESH_FIELDS = ("mesh_shape", "logical_axis_rules")


@dataclasses.dataclass
class TrainConfig:
    """A training run's collaborators and the settings of its loop; each is bound
    in gin as `train.<name>` (`train.dataset = @DatasetConfig()`, `train.train_steps = ...`).

    Args:
        dataset: the data (`DatasetConfig`: task, lengths, batch, packing,
            shuffle, seed, input shards); None: `DatasetConfig()`.
        checkpoint: checkpointing (`CheckpointConfig`: every, keep, backup,
            init checkpoint); None: `CheckpointConfig()`.
        placement: `StrategyPlacement(...)` (tf.distribute) or
            `MeshPlacement(...)` (JAX device mesh); None: `StrategyPlacement()`.
        train_steps: total optimizer steps (`TRAIN_STEPS`).
        steps_per_epoch: steps per Keras epoch (console/TensorBoard epoch
            summaries); default the checkpoint interval.
        log_every: steps between log lines / TensorBoard scalars.
        optimizer: a Keras optimizer or a factory called in the placement's
            scope (gin: `@make_optimizer`); default: `make_optimizer()`.
        jit_compile: XLA for the train step; "auto": on for JAX, off for
            TensorFlow (slow to compile on CPU; Keras turns it off under
            tf.distribute strategies anyway).
        steps_per_execution: train steps per tf.function call (TPU: e.g. 100).
        eval_split: split for the start/end loss in the summary, the validation
            curve and the plot (falls back to the training split if missing).
        summary_batches: batches of that split for those (0 = none).
        validation_freq: epochs between validation passes on those batches of
            `eval_split` (TensorBoard's `validation` run; 0 = never; none when
            the split is missing).
        expert_load_every: steps between expert-load measurements on one of
            those batches (TensorBoard scalars and `expert_load_history.json` /
            `.png`; 0 = never).
        tensorboard: write TensorBoard logs (`logs/train`, `logs/validation`).
        verbose: `fit` verbosity ("auto": progress bar on a terminal).
        write_config: callable(model_dir) writing the operative gin config (the CLI's).
        record_batches: optional file; a short hash of every training batch
            the optimizer consumes is appended to it (audits that a resumed run
            sees the same data as an uninterrupted one).
        model: factory of the model, called in the placement's scope (gin:
            `train.model = @build_distiller`, as T5X run files inject `MODEL`);
            default: gin's `build_model` (`keras_moe.gin_config.model_configurables`).
        eval_routing: how evaluation (the validation curve, the start and end
            losses, `keras-moe-eval`) routes tokens: "groups" (default) as training
            does, in each device's share of the batch, so an evaluation on another
            device count or batch routes other groups and drops other tokens;
            "sequence": each sequence apart, the same on any device count.
        dtype_policy: Keras dtype policy the model is built under, one of
            `dtype_policy.DTYPE_POLICIES`: "float32", "mixed_bfloat16" (float32
            weights and optimizer state, bfloat16 activations and matmuls,
            float32 routers) or "bfloat16" (weights too).

    Example:
    >>> config = TrainConfig.from_settings(batch_size=8, checkpoint_every=20).check()
    >>> config.dataset.batch_size, config.checkpoint.every, config.steps_per_epoch
    (8, 20, 20)
    >>> TrainConfig.from_settings(dataset=DatasetConfig(), batch_size=8)
    Traceback (most recent call last):
    ...
    keras_moe.training.errors.TrainingConfigError: train.batch_size is DatasetConfig.batch_size now, and train.dataset is bound too: bind DatasetConfig.batch_size instead.
    """  # noqa: E501 - verbatim output lines

    dataset: DatasetConfig | None = None
    checkpoint: CheckpointConfig | None = None
    placement: StrategyPlacement | MeshPlacement | None = None
    train_steps: int = 100
    steps_per_epoch: int | None = None
    log_every: int = 10
    optimizer: Any = None
    jit_compile: bool | str = "auto"
    steps_per_execution: int = 1
    eval_split: str = "validation"
    summary_batches: int = 4
    validation_freq: int = 1
    expert_load_every: int = 0
    tensorboard: bool = True
    verbose: int | str = "auto"
    write_config: Callable[[str], Any] | None = None
    record_batches: str | None = None
    model: Callable[[], Any] | None = None
    dtype_policy: str = "float32"
    eval_routing: str = "groups"

    @classmethod
    def from_settings(cls, **settings: Any) -> TrainConfig:
        """A `TrainConfig` of `train`'s keyword arguments: its fields, and the flat
        settings of earlier run files (`SHORTHANDS`, e.g. `batch_size`), which
        build the collaborator they belong to when it is not given.

        Raises:
            TrainingConfigError: a flat setting whose collaborator is given too,
                or a name that is neither.
        """
        fields = {f.name for f in dataclasses.fields(cls)}
        flat = {k: settings.pop(k) for k in list(settings) if k not in fields}
        unknown = sorted(k for k in flat if k not in SHORTHANDS)
        if unknown:
            raise TrainingConfigError(
                f"train has no setting {', '.join(unknown)}; its settings are "
                f"{', '.join(sorted(fields))} (and the shorthands {', '.join(SHORTHANDS)})."
            )
        grouped: dict[str, dict[str, Any]] = {"dataset": {}, "checkpoint": {}, "placement": {}}
        for name, value in flat.items():
            owner, field = SHORTHANDS[name]
            if settings.get(owner) is not None:
                target = _class_name(owner, name, settings[owner])
                raise TrainingConfigError(
                    f"train.{name} is {target}.{field} now, and train.{owner} is bound too: "
                    f"bind {target}.{field} instead."
                )
            grouped[owner][field] = value
        if grouped["dataset"]:
            settings["dataset"] = DatasetConfig(**grouped["dataset"])
        if grouped["checkpoint"]:
            settings["checkpoint"] = CheckpointConfig(**grouped["checkpoint"])
        if grouped["placement"]:
            settings["placement"] = _placement(grouped["placement"])
        return cls(**settings)

    def check(self) -> TrainConfig:
        """Checks every setting that needs no device and fills in the defaults;
        returns self. Raises `TrainingConfigError` naming the setting."""

        self.dataset = (self.dataset or DatasetConfig()).check()
        self.checkpoint = (self.checkpoint or CheckpointConfig()).check()
        self.placement = self.placement or StrategyPlacement()
        if not isinstance(self.placement, (StrategyPlacement, MeshPlacement)):
            raise TrainingConfigError(
                "train.placement must be @StrategyPlacement() or @MeshPlacement(), "
                f"got {self.placement!r}."
            )
        self.placement.check(self.dataset.batch_size)
        check_dtype_policy(self.dtype_policy)
        if self.eval_routing not in EVAL_ROUTINGS:
            raise TrainingConfigError(
                f"train.eval_routing must be one of {EVAL_ROUTINGS}, got {self.eval_routing!r}."
            )
        for name, minimum in (
            ("train_steps", 1),
            ("log_every", 1),
            ("summary_batches", 0),
            ("steps_per_execution", 1),
            ("validation_freq", 0),
            ("expert_load_every", 0),
        ):
            check_int(f"train.{name}", getattr(self, name), minimum, TrainingConfigError)
        if self.steps_per_epoch is None:
            self.steps_per_epoch = self.checkpoint.every
        check_int("train.steps_per_epoch", self.steps_per_epoch, 1, TrainingConfigError)
        return self


def _class_name(owner: str, name: str, bound: Any) -> str:
    if owner == "placement":
        return "MeshPlacement" if name in _MESH_FIELDS else "StrategyPlacement"
    return _CLASS_OF[owner]


def _placement(fields: dict) -> StrategyPlacement | MeshPlacement:
    """The placement of the flat settings: a mesh when `mesh_shape` is set."""
    mesh = {k: fields.pop(k) for k in _MESH_FIELDS if k in fields}
    if mesh.get("mesh_shape") is None:
        if mesh.get("logical_axis_rules") is not None:
            raise TrainingConfigError(
                "train.logical_axis_rules is set but train.mesh_shape is not: bind "
                'MeshPlacement.mesh_shape (e.g. {"data": 2, "expert": 4}) or drop the rules.'
            )
        return StrategyPlacement(**fields)
    if fields.get("strategy", "default") != "default":
        raise TrainingConfigError(
            "train.mesh_shape shards over a JAX device mesh; train.strategy="
            f"{fields['strategy']!r} is a tf.distribute strategy: bind one placement, "
            "train.placement = @MeshPlacement() or @StrategyPlacement()."
        )
    return MeshPlacement(**mesh)
