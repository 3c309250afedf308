"""One training run as an object: its settings (`TrainConfig`) and its steps (`Run`).

`keras_moe.training.trainer.train(model_dir, **settings)` is
`Run(model_dir, TrainConfig.from_settings(**settings)).train()`. A `Run` goes
through `check` (the settings and the model dir, before any device is used),
`start` (seed and placement), `build` (the model, resumed or initialised),
`read_data`, `fit` and `summarize`; each step keeps what the next one needs
on the object, so a notebook can run them one at a time. The data, the
checkpoints and the placement are the config's collaborators
(`DatasetConfig`, `CheckpointConfig`, `StrategyPlacement` / `MeshPlacement`).
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
import warnings
from typing import TYPE_CHECKING

import keras
import numpy as np

from keras_moe.gin_config import unread as gin_unread
from keras_moe.models.config import T5Config
from keras_moe.models.routing_mode import EVAL_ROUTINGS
from keras_moe.training import checkpoint as ckpt_lib
from keras_moe.training import console
from keras_moe.training.errors import TrainingConfigError, TrainingInterrupted
from keras_moe.training.log import log
from keras_moe.training.placement import MeshPlacement, multihost
from keras_moe.training.run import expert_load, load_history
from keras_moe.training.run import fit_callbacks as cb_lib
from keras_moe.training.run import input_pipeline as data_lib
from keras_moe.training.run.compiled_model import build_compiled_model
from keras_moe.training.run.dtype_policy import dtype_policy_scope
from keras_moe.training.run.model_dir import prepare_model_dir
from keras_moe.training.run.summary import TrainSummary
from keras_moe.training.train_config import TrainConfig  # noqa: F401  (re-exported)

if TYPE_CHECKING:
    import keras
    import tensorflow as tf

    from keras_moe.training.checkpoint.checkpoint_config import CheckpointConfig
    from keras_moe.training.placement import StrategyPlacement
    from keras_moe.training.run.dataset_config import DatasetConfig
    from keras_moe.training.run.summary import TrainSummary


class Run:
    """A training run of `config` into `model_dir`; `train()` does every step.

    Args:
        model_dir: output folder (checkpoints/, backup/, logs/train and logs/validation
            (TensorBoard), operative_config.gin, expert_load.png, expert_load_history.json
            and .png, summary.json); `check` refuses None.
        config: a `TrainConfig`.
    """

    def __init__(self, model_dir: str | None, config: TrainConfig):
        self._model_dir_arg, self.config = model_dir, config
        self.started_at = time.time()

    def train(self) -> TrainSummary:
        """All the steps; returns the `TrainSummary` (its `.model` the trained model)."""
        self.check()
        self.start()
        self.build()
        self.read_data()
        self.fit()
        return self.summarize()

    def check(self) -> None:
        """The settings, the process layout and the model dir, before any device is used."""

        c = self.config.check()
        # The checked config's parts the steps use, kept typed: `TrainConfig.check`
        # filled in each collaborator left None, and `steps_per_epoch`.
        assert c.dataset is not None and c.checkpoint is not None and c.placement is not None
        assert c.steps_per_epoch is not None
        self.dataset: DatasetConfig = c.dataset
        self.checkpoint: CheckpointConfig = c.checkpoint
        self.placement: StrategyPlacement | MeshPlacement = c.placement
        self.steps_per_epoch: int = c.steps_per_epoch
        self.process_index, self.process_count = multihost.process_info()
        if self.process_count > 1 and not isinstance(self.placement, MeshPlacement):
            raise TrainingConfigError(
                f"{self.process_count} JAX processes train one model over a device mesh: "
                "bind train.placement = @MeshPlacement() (its mesh_shape's product = the "
                "devices of all processes)."
            )
        self.dataset.for_process(self.process_index, self.process_count)
        self.model_dir: str = prepare_model_dir(self._model_dir_arg)

    def start(self) -> None:
        """The global seed, the placement, and the checks that need it."""

        c, data = self.config, self.dataset
        # One seed for everything: model init, and tf.data (whose op seeds combine
        # with the global one, so a resumed run must set the same global seed to
        # see the same stream after `skip`).
        keras.utils.set_random_seed(data.seed)
        self.placement = self.placement.start(self.process_index)
        # `start` set both.
        assert self.placement.chief is not None and self.placement.replicas is not None
        self.chief, self.replicas = self.placement.chief, self.placement.replicas
        self.placement.check_batch(data.batch_size)
        log(
            f"{self.placement.describe()}; {self.placement.batch_layout(data.batch_size)}; "
            f"dtype policy {c.dtype_policy}"
        )
        assert data.plan is not None  # `check` ran `for_process`
        shard_ids, num_shards, rows = data.plan
        if self.process_count > 1 or num_shards > 1:
            log(
                f"process {self.process_index} of {self.process_count}: input shards "
                f"{shard_ids} of {num_shards}, {rows} rows each, of the global batch "
                f"{data.batch_size}"
            )
        self.expert_load_every = c.expert_load_every
        if self.process_count > 1 and c.expert_load_every:
            # The probe runs on process 0 alone; the sharded model needs all of them.
            log("several processes: no expert-load scalars (measure them with keras-moe-eval)")
            self.expert_load_every = 0
        # Unknown task names and missing data fail here, before the model is built.
        data.check_task()

    def build(self) -> None:
        """The model (on the mesh, if any), resumed from the model dir or initialised.

        Once it is built, a gin binding of the model's configurables that it did
        not read is refused (`keras_moe.gin_config.unread`), before any data is read or
        anything is written.
        """

        c, data = self.config, self.dataset
        self.placement.apply()
        with dtype_policy_scope(c.dtype_policy):  # init_checkpoint's model too (resume)
            with self.placement.scope():
                self.model = build_compiled_model(
                    c.optimizer, c.jit_compile, c.steps_per_execution, c.model
                )
                config = getattr(self.model, "config", None)
                gin_unread.refuse_unread_model_bindings(
                    config if isinstance(config, T5Config) else None
                )
                set_eval_routing(self.model, c.eval_routing)
                self.model.optimizer.build(self.model.trainable_variables)
            self.shards = self.placement.shard_report(self.model)
            for name, full, local in self.shards or ():
                log(f"  {name}: {full} -> {local} on one device")
            assert data.feature_lengths is not None  # `DatasetConfig.check` set the default
            for line in self.placement.exchange_report(
                self.model, data.batch_size, data.feature_lengths
            ):
                log(f"  MoE exchange {line}")
            self.manager, self.backup_dir, self.resumed, self.start_step = self.checkpoint.restore(
                self.model,
                self.model_dir,
                c.model,
                sharded=self.process_count > 1,
                primary=self.chief,
                probe=lambda: first_inputs(data.train_stream()),
            )

    def read_data(self) -> None:
        """Checks the training split has data; the summary split's batches."""

        data = self.dataset
        self.first_batch = data_lib.check_not_empty(data.train_stream(), data.task, "train")
        self.summary_data, self.summary_split = data.summary_batches(
            self.config.eval_split, self.config.summary_batches
        )

    def _train_stream(self, skip_batches):
        ds = self.dataset.train_stream(skip_batches)
        record = self.config.record_batches
        return data_lib.record_batches(ds, record) if record else ds

    def _callbacks(self):
        """NaN guard, progress bar, the logger, step checkpoints and preemption backup."""

        manager = self.manager

        def last_checkpoint():
            meta = manager.latest()
            return meta["path"] if meta else None

        # Sharded checkpoints are written by every process (each its own shards).
        writes = self.chief or manager.sharded
        # The logger writes the TensorBoard runs (train/, validation/) itself: Keras'
        # TensorBoard callback would add `batch_`/`epoch_` copies of every metric, and
        # its `record_if` condition silences other writers between its own steps.
        tensorboard = self.config.tensorboard and _has_tensorboard()
        if self.config.tensorboard and not tensorboard:
            log(
                "the tensorboard package is not installed: no TensorBoard logs "
                "(pip install tensorboard)"
            )
        if not tensorboard:
            self.logger.log_dir = None
        return [
            cb_lib.NonFiniteLossGuard(last_checkpoint),  # First: raises before any save.
            console.CompactProgbar(),  # Router statistics go to the logger's table instead.
            self.logger,
            *self.checkpoint.callbacks(manager, self.backup_dir, writes, self.chief),
        ]

    def fit(self) -> None:
        """Writes the operative config, then `model.fit` with the run's callbacks."""

        c = self.config
        # Everything validated: now the model dir gets written.
        if self.chief and c.write_config is not None:
            c.write_config(self.model_dir)
        self.log_root = (
            os.path.join(self.model_dir, "logs")
            if self.chief
            else tempfile.mkdtemp(prefix="kmoe-logs-")
        )
        probe = (
            next(iter(self.summary_data))
            if self.summary_data is not None and self.expert_load_every
            else None
        )
        self.logger = cb_lib.TrainingLogger(
            self.log_root,
            self.dataset.tokens_per_batch,
            c.log_every,
            total_steps=c.train_steps,
            probe_batch=probe,
            expert_load_every=self.expert_load_every,
            enabled=self.chief,
            history_dir=self.model_dir,
        )
        callbacks = self._callbacks()
        # Validation curves only from the split they are named after.
        validation_data = self.summary_data if self.summary_split == c.eval_split else None
        self.eval_start = evaluate(self.model, self.summary_data) if self.start_step == 0 else None
        if self.eval_start is not None and validation_data is not None:
            self.logger.set_model(self.model)
            self.logger.write_validation(0, self.eval_start)
        if self.eval_start is None:  # resumed, or no summary data: nothing built the metrics
            build_metrics(self.model, self.first_batch)
        verbose = c.verbose
        if verbose == "auto":
            verbose = 1 if sys.stdout.isatty() else 2
        validation = {}
        if validation_data is not None and c.validation_freq:
            validation = {"validation_data": validation_data, "validation_freq": c.validation_freq}
        skip = self.resumed["batches_consumed"] if self.resumed else 0
        start = time.time()
        try:
            for initial_epoch, epochs, spe, first_step in fit_segments(
                self.start_step, c.train_steps, self.steps_per_epoch
            ):
                self.model.fit(
                    self._train_stream(skip + first_step - self.start_step),
                    initial_epoch=initial_epoch,
                    epochs=epochs,
                    steps_per_epoch=spe,
                    callbacks=callbacks,
                    verbose=verbose,
                    shuffle=False,  # seqio already shuffles the stream, by seed.
                    **validation,
                )
        except KeyboardInterrupt:
            latest = self.manager.latest()
            raise TrainingInterrupted(
                int(self.model.optimizer.iterations.numpy()), latest["path"] if latest else None
            ) from None
        except Exception as e:
            failure = self.placement.peer_failure(e, int(self.model.optimizer.iterations.numpy()))
            if failure is None:
                raise
            raise failure from None
        self.train_seconds = time.time() - start

    def summarize(self) -> TrainSummary:
        """The end loss, the expert-load plot and summary.json; returns the `TrainSummary`."""

        c = self.config
        end_step = int(self.model.optimizer.iterations.numpy())
        eval_end = evaluate(self.model, self.summary_data)
        plot_path = None
        if self.chief and self.summary_data is not None:
            shared_with = self.placement.shared_with(self.process_count)
            if shared_with:
                # A pass on the chief alone would need the others for the MoE layers'
                # metric variables or the sharded weights (collectives): skipped.
                log(f"{shared_with}: no expert-load plot (measure it with keras-moe-eval)")
            else:
                plot_path = expert_load.write_expert_load(
                    self.model, self.summary_data, self.summary_split, self.model_dir, end_step
                )
        history = self.logger.history
        history_png = os.path.join(self.model_dir, load_history.PNG_NAME)
        history_plot = history_png if self.chief and os.path.isfile(history_png) else None
        latest = self.manager.latest()
        assert self.dataset.plan is not None  # `check` ran `for_process`
        summary = TrainSummary(
            {
                "task": self.dataset.task,
                "strategy": self.placement.name,
                "replicas": self.replicas,
                "dtype_policy": c.dtype_policy,
                "start_step": self.start_step,
                "end_step": end_step,
                "resumed_from": self.resumed["path"] if self.resumed else None,
                "first_step_loss": history[0][1] if history and self.start_step == 0 else None,
                "last_epoch_loss": history[-1][1] if history else None,
                "eval_split": self.summary_split,
                "eval_start": self.eval_start,
                "eval_end": eval_end,
                "train_seconds": self.train_seconds,
                "wall_seconds": time.time() - self.started_at,
                "checkpoint": latest["path"] if latest else None,
                "tensorboard": self.log_root,
                "expert_load_plot": plot_path,
                "expert_load_history": history_plot,
                "operative_config": os.path.join(self.model_dir, "operative_config.gin"),
                "history": history,
                "mesh": self.placement.mesh,
                "processes": self.process_count,
                "input_shards": self.dataset.plan[1],
                "shards": (
                    [[n, list(f), list(loc)] for n, f, loc in self.shards] if self.shards else None
                ),
            }
        )
        if self.chief:
            ckpt_lib.atomic_write_text(
                os.path.join(self.model_dir, "summary.json"), json.dumps(summary, indent=1)
            )
        summary.model = self.model
        return summary


def set_eval_routing(model: keras.Model, eval_routing: str) -> None:
    """Gives `model` the evaluation routing `train.eval_routing` names (`RoutingScopeMixin`);
    a model without it can only evaluate as it trains."""

    if eval_routing not in EVAL_ROUTINGS:
        raise TrainingConfigError(
            f"train.eval_routing must be one of {EVAL_ROUTINGS}, got {eval_routing!r}."
        )
    if hasattr(type(model), "eval_routing"):
        model.eval_routing = eval_routing
    elif eval_routing != "groups":
        raise TrainingConfigError(
            f"train.eval_routing={eval_routing!r} needs a keras_moe "
            f"EncoderDecoder; {type(model).__name__} evaluates as it trains."
        )


def first_inputs(ds: tf.data.Dataset) -> dict:
    """The model inputs of `ds`'s first `(inputs, targets, weights)` batch."""
    for batch in ds.take(1):
        return batch[0]
    raise TrainingConfigError("the training split produced no batch of the requested size.")


def fit_segments(start: int, total: int, steps_per_epoch: int) -> list[tuple]:
    """[(initial_epoch, epochs, steps_per_epoch, start_step)] covering steps start..total.

    Example:
    >>> fit_segments(3, 10, 4)  # a partial epoch to the boundary, then whole ones
    [(0, 1, 1, 3), (1, 2, 4, 4), (2, 3, 2, 8)]
    """
    calls: list[tuple[int, int, int, int]] = []
    step = start
    while step < total:
        n = min(steps_per_epoch - step % steps_per_epoch, total - step)
        epoch = step // steps_per_epoch
        if (
            calls
            and n == steps_per_epoch
            and calls[-1][2] == steps_per_epoch
            and calls[-1][1] == epoch
        ):
            first, _, spe, s0 = calls[-1]
            calls[-1] = (first, epoch + 1, spe, s0)
        else:
            calls.append((epoch, epoch + 1, n, step))
        step += n
    return calls


def build_metrics(model: keras.Model, batch: tuple) -> None:
    """Builds the compiled loss and metrics on `batch` (JAX backend) before `fit`.

    Keras's JAX `fit` builds whatever is not built yet from a batch it takes
    off the training stream, which shifts the run's data by one batch. A test
    step on a batch of a separate stream builds them instead.
    """

    if keras.backend.backend() == "jax":
        model.test_on_batch(*keras.tree.map_structure(np.asarray, batch))


def evaluate(model: keras.Model, data: tf.data.Dataset | None) -> dict | None:
    """`model.evaluate` on the finite `data` as a dict of floats (None without data)."""
    if data is None:
        return None
    with warnings.catch_warnings():  # "ran out of data": the summary set is finite.
        warnings.simplefilter("ignore")
        out = model.evaluate(data, verbose=0, return_dict=True)
    return {k: float(v) for k, v in out.items()}


def _has_tensorboard() -> bool:
    try:
        import tensorboard  # noqa: F401
    except ImportError:
        return False
    return True
