"""One training run as an object: its settings (`TrainConfig`) and its steps (`Run`).

`keras_moe.training.trainer.train(model_dir, **settings)` is
`Run(model_dir, TrainConfig(**settings)).train()`. A `Run` goes through
`check` (cheap settings, before anything touches TensorFlow or the model dir),
`start` (seed, placement: a tf.distribute strategy or a JAX mesh, see
`keras_moe.training.placement`), `build` (the model, resumed or
initialised), `read_data`, `fit` and `summarize`; each step keeps what the
next one needs on the object, so a notebook can run them one at a time.
"""

import dataclasses
import json
import os
import sys
import tempfile
import time

from keras_moe.training import checkpoint as ckpt_lib
from keras_moe.training.errors import TrainingConfigError, TrainingInterrupted
from keras_moe.training.log import log
from keras_moe.validation import check_int


@dataclasses.dataclass
class TrainConfig:
    """The settings of a training run; each is bound in gin as `train.<name>`.

    Args:
        task: seqio task or mixture name (`MIXTURE_OR_TASK_NAME`).
        feature_lengths: {"inputs": int, "targets": int} (`TASK_FEATURE_LENGTHS`);
            None: 128 / 32.
        batch_size: global batch size (`BATCH_SIZE`), split across replicas.
        train_steps: total optimizer steps (`TRAIN_STEPS`).
        steps_per_epoch: steps per Keras epoch (console/TensorBoard epoch
            summaries); default `checkpoint_every`.
        checkpoint_every: steps between checkpoints.
        keep_checkpoints: newest checkpoints kept.
        backup_every: steps between preemption backups (BackupAndRestore);
            None: at every epoch end.
        log_every: steps between log lines / TensorBoard scalars.
        pack, shuffle, seed: seqio input options.
        strategy: "default", "mirrored", "multi_worker" or "tpu" (`train.strategy`).
        tpu_name: TPU for "tpu" (`train.tpu_name`): "local" on a TPU VM, or a name.
        mirrored_devices: devices for "mirrored" (default: all local GPUs/CPU).
        optimizer: a Keras optimizer or a factory called under the strategy scope
            (gin: `@make_optimizer`); default: `make_optimizer()` with its defaults.
        jit_compile: XLA for the train step; "auto": on for JAX, off for
            TensorFlow (slow to compile on CPU; Keras turns it off under
            tf.distribute strategies anyway).
        steps_per_execution: train steps per tf.function call (TPU: e.g. 100).
        init_checkpoint: weights to start from when model_dir has no checkpoint
            (see `stages.load_init_checkpoint`).
        eval_split: split for the start/end loss in the summary and the plot
            (falls back to the training split if missing).
        summary_batches: batches of that split for the summary loss and the
            expert-load plot (0 = skip both).
        validation_freq: epochs between validation passes on those batches of
            `eval_split` at epoch ends (TensorBoard's `validation` run; 0 = never;
            none when the split is missing).
        expert_load_every: steps between expert-load measurements on one of those
            batches (TensorBoard scalars and `expert_load_history.json` / `.png`;
            0 = never).
        tensorboard: write TensorBoard logs (`logs/train`, `logs/validation`).
        verbose: `fit` verbosity ("auto": progress bar on a terminal).
        write_config: callable(model_dir) writing the operative gin config (the CLI's).
        collective_timeout: "multi_worker": seconds after which a stuck collective
            (e.g. a dead peer) fails the step instead of hanging (None: no limit).
        cluster_wait_timeout: "multi_worker": seconds to wait for all workers
            to come up at start (None: forever).
        record_batches: optional file; a short hash of every training batch
            the optimizer consumes is appended to it (audits that a resumed run
            sees the same data as an uninterrupted one).
        model: factory of the model to train, called under the strategy scope
            (gin: `train.model = @build_distiller`, as T5X run files inject
            `MODEL`); default: gin's `build_model` (`keras_moe.models.gin_configurables`).
        mesh_shape: JAX backend: shard the model over a device mesh of this
            shape (`train.mesh_shape`, e.g. {"data": 2, "expert": 4}; see
            `keras_moe.sharding.configure_mesh`), applied before it is built.
        logical_axis_rules: the mesh's `(logical axis, mesh axes)` rules
            (`train.logical_axis_rules`); None: `keras_moe.layouts.DEFAULT_RULES`.
        input_shards: the global batch is this many equal slices, each read
            from its own `seqio.ShardInfo` shard, the shards split over the JAX
            processes (`train.input_shards`; see `multihost.input_plan`); None: one
            per process (one process: the task read unsharded). Fixing it keeps
            the data stream the same for any number of processes.
        dtype_policy: Keras dtype policy the model is built under
            (`train.dtype_policy`, one of `trainer.DTYPE_POLICIES`): "float32", or
            "mixed_bfloat16" (float32 weights and optimizer state, bfloat16
            activations and matmuls, float32 routers), or "bfloat16" (weights
            too). The global policy is restored once the model is built.

    Example:
    >>> TrainConfig(batch_size=8).check()
    >>> TrainConfig(batch_size=0).check()
    Traceback (most recent call last):
    ...
    keras_moe.training.errors.TrainingConfigError: `train.batch_size` must be an integer >= 1, got 0.
    """  # noqa: E501 - verbatim output lines

    task: str = "embedded_span_corruption"
    feature_lengths: dict = None
    batch_size: int = 16
    train_steps: int = 100
    steps_per_epoch: int = None
    checkpoint_every: int = 50
    keep_checkpoints: int = 3
    backup_every: int = None
    log_every: int = 10
    pack: bool = True
    shuffle: bool = True
    seed: int = 0
    strategy: str = "default"
    tpu_name: str = None
    mirrored_devices: list = None
    optimizer: object = None
    jit_compile: object = "auto"
    steps_per_execution: int = 1
    init_checkpoint: str = None
    eval_split: str = "validation"
    summary_batches: int = 4
    validation_freq: int = 1
    expert_load_every: int = 0
    tensorboard: bool = True
    verbose: object = "auto"
    write_config: object = None
    collective_timeout: float = 600
    cluster_wait_timeout: float = 600
    record_batches: str = None
    model: object = None
    mesh_shape: dict = None
    logical_axis_rules: tuple = None
    input_shards: int = None
    dtype_policy: str = "float32"

    def check(self):
        """Checks the settings that need no TensorFlow; fills in the defaults that depend
        on others. Raises `TrainingConfigError` naming the setting."""
        from keras_moe.training import data as data_lib
        from keras_moe.training import mesh as mesh_lib
        from keras_moe.training.trainer import check_dtype_policy

        if self.feature_lengths is None:
            self.feature_lengths = {"inputs": 128, "targets": 32}
        data_lib.check_feature_lengths(self.feature_lengths)
        check_dtype_policy(self.dtype_policy)
        for name, minimum in (("batch_size", 1), ("train_steps", 1), ("checkpoint_every", 1),
                              ("keep_checkpoints", 1), ("log_every", 1), ("summary_batches", 0),
                              ("steps_per_execution", 1), ("validation_freq", 0)):
            check_int(f"train.{name}", getattr(self, name), minimum, TrainingConfigError)
        if self.steps_per_epoch is None:
            self.steps_per_epoch = self.checkpoint_every
        check_int("train.steps_per_epoch", self.steps_per_epoch, 1, TrainingConfigError)
        if self.backup_every is not None:
            check_int("train.backup_every", self.backup_every, 1, TrainingConfigError)
        mesh_lib.check_mesh(self.mesh_shape, self.logical_axis_rules, self.strategy)
        mesh_lib.check_batch_splits(self.mesh_shape, self.logical_axis_rules, self.batch_size)


class Run:
    """A training run of `config` into `model_dir`; `train()` does every step.

    Args:
        model_dir: output folder (checkpoints/, backup/, logs/train and logs/validation
            (TensorBoard), operative_config.gin, expert_load.png, expert_load_history.json
            and .png, summary.json).
        config: a `TrainConfig`.
    """

    def __init__(self, model_dir, config):
        self.model_dir, self.config = model_dir, config
        self.started_at = time.time()

    def train(self):
        """All the steps; returns the `TrainSummary` (its `.model` the trained model)."""
        self.check()
        self.start()
        self.build()
        self.read_data()
        self.fit()
        return self.summarize()

    def check(self):
        """The settings, the process layout and the model dir, before any device is used."""
        from keras_moe.training import multihost
        from keras_moe.training.trainer import prepare_model_dir

        c = self.config
        c.check()
        self.process_index, self.process_count = multihost.process_info()
        if self.process_count > 1 and c.mesh_shape is None:
            raise TrainingConfigError(
                f"{self.process_count} JAX processes train one model over a device mesh: "
                "bind train.mesh_shape (its product = the devices of all processes).")
        self.input_plan = multihost.input_plan(c.batch_size, c.input_shards,
                                               self.process_index, self.process_count)
        self.model_dir = prepare_model_dir(self.model_dir)

    def start(self):
        """The global seed, the strategy, and the checks that need it."""
        import keras

        from keras_moe.training import data as data_lib
        from keras_moe.training.placement import make_placement

        c = self.config
        # One seed for everything: model init, and tf.data (whose op seeds combine
        # with the global one, so a resumed run must set the same global seed to
        # see the same stream after `skip`).
        keras.utils.set_random_seed(c.seed)
        self.placement = make_placement(c, self.process_index)
        self.chief, self.replicas = self.placement.chief, self.placement.replicas
        if c.batch_size % self.replicas:
            raise TrainingConfigError(
                f"BATCH_SIZE={c.batch_size} is not divisible by the {self.replicas} replicas "
                f"of train.strategy={c.strategy!r}.")
        log(f"{self.placement.describe()}; {self.placement.batch_layout(c.batch_size)}; "
            f"dtype policy {c.dtype_policy}")
        shard_ids, num_shards, rows = self.input_plan
        if self.process_count > 1 or num_shards > 1:
            log(f"process {self.process_index} of {self.process_count}: input shards "
                f"{shard_ids} of {num_shards}, {rows} rows each, of the global batch "
                f"{c.batch_size}")
        self.expert_load_every = c.expert_load_every
        if self.process_count > 1 and c.expert_load_every:
            # The probe runs on process 0 alone; the sharded model needs all of them.
            log("several processes: no expert-load scalars (measure them with keras-moe-eval)")
            self.expert_load_every = 0
        # Unknown task names and missing data fail here, before the model is built.
        data_lib.get_task(c.task)
        data_lib.check_data(c.task)

    def build(self):
        """The model (on the mesh, if any), resumed from the model dir or initialised.

        Once it is built, a gin binding of the model's configurables that it did
        not read is refused (`keras_moe.gin_unread`), before any data is read or
        anything is written.
        """
        from keras_moe import gin_unread
        from keras_moe.models.config import T5Config
        from keras_moe.training import stages
        from keras_moe.training.trainer import build_compiled_model, dtype_policy_scope

        c = self.config
        self.placement.apply()
        with dtype_policy_scope(c.dtype_policy):  # init_checkpoint's model too (resume)
            with self.placement.scope():
                self.model = build_compiled_model(c.optimizer, c.jit_compile,
                                                  c.steps_per_execution, c.model)
                config = getattr(self.model, "config", None)
                gin_unread.refuse_unread_model_bindings(
                    config if isinstance(config, T5Config) else None)
                self.model.optimizer.build(self.model.trainable_variables)
            self.shards = self.placement.shard_report(self.model)
            for name, full, local in self.shards or ():
                log(f"  {name}: {full} -> {local} on one device")
            for line in self.placement.exchange_report(self.model, c.batch_size,
                                                       c.feature_lengths):
                log(f"  MoE exchange {line}")
            self.manager, self.backup_dir, self.resumed, self.start_step = stages.resume(
                self.model, self.model_dir, c.keep_checkpoints, c.init_checkpoint, c.model,
                sharded=self.process_count > 1, primary=self.chief)

    def eval_dataset(self, split):
        """This process's batches of `split`, in order, once."""
        from keras_moe.training import data as data_lib

        c = self.config
        return data_lib.make_process_dataset(c.task, c.feature_lengths, split, self.input_plan,
                                             pack=c.pack, shuffle=False, seed=c.seed,
                                             repeat=False)

    def train_dataset(self, skip_batches=0):
        """This process's training batches, repeated, the first `skip_batches` skipped."""
        from keras_moe.training import data as data_lib

        c = self.config
        return data_lib.make_process_dataset(c.task, c.feature_lengths, "train", self.input_plan,
                                             pack=c.pack, shuffle=c.shuffle, seed=c.seed,
                                             repeat=True, skip_batches=skip_batches)

    def read_data(self):
        """Checks the training split has data; the summary split's batches."""
        from keras_moe.training import data as data_lib
        from keras_moe.training import stages

        c = self.config
        self.first_batch = data_lib.check_not_empty(self.train_dataset(), c.task, "train")
        self.summary_data, self.summary_split = stages.summary_dataset(
            self.eval_dataset, c.eval_split, c.summary_batches, self.train_dataset)

    def _recorded_train_dataset(self, skip_batches):
        from keras_moe.training import data as data_lib

        ds = self.train_dataset(skip_batches)
        record = self.config.record_batches
        return data_lib.record_batches(ds, record) if record else ds

    def fit(self):
        """Writes the operative config, then `model.fit` with the run's callbacks."""
        from keras_moe.training import callbacks as cb_lib
        from keras_moe.training import stages

        c = self.config
        # Everything validated: now the model dir gets written.
        if self.chief and c.write_config is not None:
            c.write_config(self.model_dir)
        self.log_root = (os.path.join(self.model_dir, "logs") if self.chief
                         else tempfile.mkdtemp(prefix="kmoe-logs-"))
        probe = (next(iter(self.summary_data))
                 if self.summary_data is not None and self.expert_load_every else None)
        self.logger = cb_lib.TrainingLogger(
            self.log_root,
            c.batch_size * (c.feature_lengths["inputs"] + c.feature_lengths["targets"]),
            c.log_every, total_steps=c.train_steps, probe_batch=probe,
            expert_load_every=self.expert_load_every, enabled=self.chief,
            history_dir=self.model_dir)
        callbacks = stages.make_callbacks(self.manager, self.backup_dir, self.chief, self.logger,
                                          c.checkpoint_every, c.backup_every, c.tensorboard)
        # Validation curves only from the split they are named after.
        validation_data = self.summary_data if self.summary_split == c.eval_split else None
        self.eval_start = (stages.evaluate(self.model, self.summary_data)
                           if self.start_step == 0 else None)
        if self.eval_start is not None and validation_data is not None:
            self.logger.set_model(self.model)
            self.logger.write_validation(0, self.eval_start)
        verbose = c.verbose
        if verbose == "auto":
            verbose = 1 if sys.stdout.isatty() else 2
        if self.eval_start is None:  # resumed, or no summary data: nothing built the metrics
            stages.build_metrics(self.model, self.first_batch)
        skip = self.resumed["batches_consumed"] if self.resumed else 0
        try:
            self.train_seconds = stages.fit(
                self.model, self._recorded_train_dataset, self.start_step, skip, c.train_steps,
                c.steps_per_epoch, callbacks, verbose, c.strategy, c.collective_timeout,
                validation_data, c.validation_freq)
        except KeyboardInterrupt:
            latest = self.manager.latest()
            raise TrainingInterrupted(int(self.model.optimizer.iterations.numpy()),
                                      latest["path"] if latest else None) from None

    def summarize(self):
        """The end loss, the expert-load plot and summary.json; returns the `TrainSummary`."""
        from keras_moe.training import load_history, stages
        from keras_moe.training.trainer import TrainSummary

        c = self.config
        end_step = int(self.model.optimizer.iterations.numpy())
        eval_end = stages.evaluate(self.model, self.summary_data)
        plot_path = None
        if self.chief and self.summary_data is not None:
            shared_with = (f"{self.process_count} processes" if self.process_count > 1
                           else "multi_worker" if c.strategy == "multi_worker" else None)
            plot_path = stages.plot_expert_load(self.model, self.summary_data,
                                                self.summary_split, self.model_dir, end_step,
                                                shared_with)
        history = self.logger.history
        history_plot = os.path.join(self.model_dir, load_history.PNG_NAME)
        if not (self.chief and os.path.isfile(history_plot)):
            history_plot = None
        latest = self.manager.latest()
        summary = TrainSummary({
            "task": c.task, "strategy": c.strategy, "replicas": self.replicas,
            "dtype_policy": c.dtype_policy,
            "start_step": self.start_step, "end_step": end_step,
            "resumed_from": self.resumed["path"] if self.resumed else None,
            "first_step_loss": history[0][1] if history and self.start_step == 0 else None,
            "last_epoch_loss": history[-1][1] if history else None,
            "eval_split": self.summary_split,
            "eval_start": self.eval_start, "eval_end": eval_end,
            "train_seconds": self.train_seconds,
            "wall_seconds": time.time() - self.started_at,
            "checkpoint": latest["path"] if latest else None,
            "tensorboard": self.log_root, "expert_load_plot": plot_path,
            "expert_load_history": history_plot,
            "operative_config": os.path.join(self.model_dir, "operative_config.gin"),
            "history": history, "mesh": self.placement.mesh, "processes": self.process_count,
            "input_shards": self.input_plan[1],
            "shards": ([[n, list(f), list(loc)] for n, f, loc in self.shards]
                       if self.shards else None),
        })
        if self.chief:
            ckpt_lib.atomic_write_text(os.path.join(self.model_dir, "summary.json"),
                                       json.dumps(summary, indent=1))
        summary.model = self.model
        return summary
