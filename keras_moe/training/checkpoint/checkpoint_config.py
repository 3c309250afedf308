"""A run's checkpoints: how often and how many, the preemption backup, where a fresh run starts."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from keras_moe.convert import from_hf, is_hf_folder
from keras_moe.training import checkpoint as ckpt_lib
from keras_moe.training.checkpoint.upcycle_checkpoint import Upcycle, load_upcycled
from keras_moe.training.errors import TrainingConfigError
from keras_moe.training.log import log
from keras_moe.validation import check_int

if TYPE_CHECKING:
    import keras


@dataclasses.dataclass
class CheckpointConfig:
    """Checkpointing of a run (gin: `train.checkpoint = @CheckpointConfig()`).

    Args:
        every: steps between step checkpoints (`model_dir/checkpoints`).
        keep: newest step checkpoints kept.
        backup_every: steps between preemption backups (`model_dir/backup`);
            None: at every epoch end.
        init_checkpoint: weights a run starts from when its model_dir holds no
            checkpoint (`INIT_CHECKPOINT`; see `load_init_checkpoint`).
        upcycle: an `Upcycle` to start this sparse run from the dense model of
            `init_checkpoint` (`upcycle_checkpoint.load_upcycled`); None: the same
            architecture.

    Example:
    >>> CheckpointConfig(every=100, keep=2).check()
    CheckpointConfig(every=100, keep=2, backup_every=None, init_checkpoint=None, upcycle=None)
    >>> CheckpointConfig(keep=0).check()
    Traceback (most recent call last):
    ...
    keras_moe.training.errors.TrainingConfigError: `CheckpointConfig.keep` must be an integer >= 1, got 0.
    """  # noqa: E501 - verbatim output lines

    every: int = 50
    keep: int = 3
    backup_every: int | None = None
    init_checkpoint: str | None = None
    upcycle: Upcycle | None = None

    def check(self) -> CheckpointConfig:
        """Checks every setting; returns self. Raises `TrainingConfigError` naming it."""
        check_int("CheckpointConfig.every", self.every, 1, TrainingConfigError)
        check_int("CheckpointConfig.keep", self.keep, 1, TrainingConfigError)
        if self.backup_every is not None:
            check_int("CheckpointConfig.backup_every", self.backup_every, 1, TrainingConfigError)
        if self.init_checkpoint is not None and not isinstance(self.init_checkpoint, str):
            raise TrainingConfigError(
                f"CheckpointConfig.init_checkpoint (INIT_CHECKPOINT) must be a path or None, "
                f"got {self.init_checkpoint!r}."
            )
        if self.upcycle is not None:
            if not isinstance(self.upcycle, Upcycle):
                raise TrainingConfigError(
                    f"CheckpointConfig.upcycle must be an Upcycle "
                    f"(@Upcycle()) or None, got {self.upcycle!r}."
                )
            if not self.init_checkpoint:
                raise TrainingConfigError(
                    "CheckpointConfig.upcycle needs the dense checkpoint to upcycle: set "
                    "CheckpointConfig.init_checkpoint (INIT_CHECKPOINT)."
                )
            self.upcycle.check()
        return self

    def restore(
        self,
        model: keras.Model,
        model_dir: str,
        model_factory: Callable | None = None,
        sharded: bool = False,
        primary: bool = True,
        probe: Callable | None = None,
    ) -> tuple:
        """Restores the newest loadable checkpoint of `model_dir` (step checkpoints
        or preemption backup) into `model`, or else `init_checkpoint` (weights only).

        Args:
            model: the built, compiled model.
            model_dir: the run's folder.
            model_factory: the factory the model came from (reads a keras_moe
                `init_checkpoint`).
            sharded, primary: see `CheckpointManager` (several JAX processes).
            probe: gives a batch of model inputs on which an upcycled start is
                compared with the dense model (`Upcycle.load`).

        Returns:
            `(manager, backup_dir, resumed, start_step)`: the step-checkpoint
            manager, the backup folder, the restored checkpoint's metadata (None
            when starting fresh) and the optimizer step to continue from.
        """
        manager = ckpt_lib.CheckpointManager(
            os.path.join(model_dir, "checkpoints"), self.keep, sharded=sharded, primary=primary
        )
        backup_dir = os.path.join(model_dir, "backup")
        candidates = manager.all() + ckpt_lib.CheckpointManager(backup_dir).all()
        resumed = None
        if candidates:
            resumed = ckpt_lib.restore_newest(model, candidates, log=log)
            if resumed is None:
                raise TrainingConfigError(
                    f"model_dir {model_dir} holds checkpoints but none of them can be loaded "
                    "(all corrupt, see above); move them away to start from step 0."
                )
        elif self.init_checkpoint and self.upcycle is not None:
            load_upcycled(model, self.init_checkpoint, self.upcycle, probe)
        elif self.init_checkpoint:
            load_init_checkpoint(model, self.init_checkpoint, model_factory)
        start_step = int(model.optimizer.iterations.numpy())
        if resumed is None:
            log(f"no checkpoint in model_dir: starting from step {start_step}")
            return manager, backup_dir, None, start_step
        if start_step != resumed["step"]:
            raise TrainingConfigError(
                f"checkpoint {resumed['path']} restored step {start_step}, its metadata says "
                f"{resumed['step']}; the checkpoint is inconsistent."
            )
        log(
            f"resumed from checkpoint {resumed['path']} at step {start_step} "
            f"(skipping {resumed['batches_consumed']} consumed batches)"
        )
        return manager, backup_dir, resumed, start_step

    def callbacks(
        self, manager: ckpt_lib.CheckpointManager, backup_dir: str, writes: bool, chief: bool
    ) -> list:
        """The step-checkpoint and preemption-backup callbacks of `fit`.

        Args:
            manager: the step-checkpoint manager `restore` returned.
            backup_dir: the backup folder `restore` returned.
            writes: whether this process writes (the chief, or every process of
                a sharded run, each its own shards).
            chief: whether this process is the chief.
        """
        return [
            ckpt_lib.StepCheckpoint(manager, self.every, enabled=writes, log=log),
            ckpt_lib.PreemptionBackup(
                backup_dir,
                save_freq=self.backup_every or "epoch",
                enabled=writes,
                sharded=manager.sharded,
                primary=chief,
            ),
        ]


def load_init_checkpoint(
    model: keras.Model, path: str, build_source: Callable[[], Any] | None = None
) -> None:
    """Initialises the model weights (not the optimizer) from `path`.

    Args:
        model: the model to initialise.
        path: a `.weights.h5` file, a keras_moe model dir or checkpoint folder
            (its newest checkpoint), or a Hugging Face T5/SwitchTransformers
            folder (`config.json` + `*.safetensors`, via `keras_moe.convert.from_hf`).
        build_source: the factory a keras_moe checkpoint's model came from
            (default: gin's `build_model`).

    Raises:
        TrainingConfigError: when the checkpoint does not fit the model.
    """
    from keras_moe.gin_config import model_configurables

    if is_hf_folder(path):
        source = from_hf(path)
        kind = "Hugging Face checkpoint"
    else:
        weights = ckpt_lib.resolve_checkpoint(path, "init_checkpoint")
        source = (build_source or model_configurables.build_model)()
        try:
            source.load_weights(weights)
        except (ValueError, KeyError, OSError) as e:
            raise TrainingConfigError(
                f"init_checkpoint {weights} does not fit the configured model: {e}"
            ) from None
        kind = "checkpoint"
        path = weights
    src, dst = source.weights, model.weights
    if len(src) != len(dst) or any(
        tuple(a.shape) != tuple(b.shape) for a, b in zip(src, dst, strict=False)
    ):
        raise TrainingConfigError(
            f"init_checkpoint {path!r} ({kind}) has a different architecture than the "
            "configured model; bind the same model gin file."
        )
    for a, b in zip(src, dst, strict=False):
        b.assign(a.value)
    log(f"initialised the model from {kind} {path}")
