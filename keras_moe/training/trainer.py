"""The training job: strategy, data, model, optimizer, `model.fit`, checkpoints, plot.

`train(model_dir, ...)` is gin-configurable (see `gin_configurables`); every
argument can be bound in a run file, e.g. `train.batch_size = %BATCH_SIZE`.
"""

import contextlib
import json
import math
import os
import sys
import tempfile
import time

from keras_moe.training import checkpoint as ckpt_lib
from keras_moe.training.errors import TrainingConfigError
from keras_moe.training.log import log
from keras_moe.validation import check_int


def _check_int(name, value, minimum):
    check_int(f"train.{name}", value, minimum, TrainingConfigError)


# Keras dtype policies a run may train under (`DTYPE_POLICY`): float32
# everywhere; float32 variables with bfloat16 compute (the routers stay float32,
# see `keras_moe.routing.base.Router`); bfloat16 variables and compute.
DTYPE_POLICIES = ("float32", "mixed_bfloat16", "bfloat16")


def check_dtype_policy(dtype_policy, name="train.dtype_policy"):
    """Returns `dtype_policy` if it is one of `DTYPE_POLICIES`, else raises.

    Args:
        dtype_policy: the policy's name, e.g. "mixed_bfloat16".
        name: the setting named in the error message.

    Raises:
        TrainingConfigError: naming the setting and the allowed values.

    Example:
    >>> check_dtype_policy("mixed_bfloat16")
    'mixed_bfloat16'
    >>> check_dtype_policy("fp16")
    Traceback (most recent call last):
    ...
    keras_moe.training.errors.TrainingConfigError: train.dtype_policy (DTYPE_POLICY) must be one of 'float32', 'mixed_bfloat16', 'bfloat16'; got 'fp16'.
    """
    if not isinstance(dtype_policy, str) or dtype_policy not in DTYPE_POLICIES:
        allowed = ", ".join(repr(p) for p in DTYPE_POLICIES)
        raise TrainingConfigError(
            f"{name} (DTYPE_POLICY) must be one of {allowed}; got {dtype_policy!r}.")
    return dtype_policy


@contextlib.contextmanager
def dtype_policy_scope(dtype_policy):
    """Keras' global dtype policy is `dtype_policy` inside the block, the previous one after.

    Layers keep the policy they were built with, so building the model inside
    the block is enough; restoring it leaves a notebook's later layers as they were.

    Args:
        dtype_policy: one of `DTYPE_POLICIES`.

    Example:
    >>> import keras
    >>> before = keras.config.dtype_policy().name
    >>> with dtype_policy_scope("mixed_bfloat16"):
    ...     layer = keras.layers.Dense(2)
    >>> layer.compute_dtype, layer.variable_dtype
    ('bfloat16', 'float32')
    >>> keras.config.dtype_policy().name == before
    True
    """
    import keras

    check_dtype_policy(dtype_policy)
    previous = keras.config.dtype_policy()
    keras.config.set_dtype_policy(dtype_policy)
    try:
        yield
    finally:
        keras.config.set_dtype_policy(previous)


def prepare_model_dir(model_dir):
    """Creates `model_dir` if needed and checks it is a writable folder."""
    if not model_dir or not isinstance(model_dir, str):
        raise TrainingConfigError(f"--model_dir must be a folder path, got {model_dir!r}.")
    if model_dir.startswith("gs://"):
        raise TrainingConfigError(
            f"--model_dir {model_dir!r}: gs:// paths are not supported by the atomic "
            "checkpoint writer; use a local or mounted (gcsfuse) folder.")
    if os.path.exists(model_dir) and not os.path.isdir(model_dir):
        raise TrainingConfigError(f"--model_dir {model_dir!r} exists and is not a folder.")
    try:
        os.makedirs(model_dir, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=model_dir, prefix=".write-test-"):
            pass
    except OSError as e:
        raise TrainingConfigError(f"--model_dir {model_dir!r} is not writable: {e}") from None
    return os.path.abspath(model_dir)


def build_compiled_model(optimizer=None, jit_compile="auto", steps_per_execution=1, model=None):
    """The model of the factory `model` (default: `keras_moe.models.build_model`,
    as bound in gin), compiled with its `compile_defaults` (T5: the T5 loss).

    Args:
        optimizer: a Keras optimizer, or a factory of one called here (so under
            the caller's strategy scope); None: `make_optimizer()` with its
            own defaults (run files bind `train.optimizer = @make_optimizer`).
        jit_compile, steps_per_execution: as for `Model.compile`.
        model: a factory of the uncompiled model, e.g. gin's `@build_model` or
            `@build_distiller`.
    """
    import keras

    from keras_moe.training import schedules

    if model is None:
        from keras_moe import models

        model = models.build_model
    try:
        built = model()
    except (TypeError, ValueError) as e:
        raise TrainingConfigError(f"cannot build the model from the gin config: {e}") from None
    if callable(optimizer) and not isinstance(optimizer, keras.optimizers.Optimizer):
        optimizer = optimizer()  # A factory (gin `@make_optimizer`), called in scope.
    if optimizer is None:
        optimizer = schedules.make_optimizer()
    kwargs = built.compile_defaults(optimizer=optimizer, jit_compile=jit_compile)
    built.compile(steps_per_execution=steps_per_execution, **kwargs)
    return built


class TrainSummary(dict):
    """`train`'s summary (a dict, as written to summary.json) with the trained model as `.model`."""

    model = None


def train(model_dir, task="embedded_span_corruption",
          feature_lengths=None, batch_size=16, train_steps=100, steps_per_epoch=None,
          checkpoint_every=50, keep_checkpoints=3, backup_every=None, log_every=10,
          pack=True, shuffle=True, seed=0, strategy="default", tpu_name=None,
          mirrored_devices=None, optimizer=None, jit_compile="auto", steps_per_execution=1,
          init_checkpoint=None, eval_split="validation", summary_batches=4,
          expert_load_every=0, tensorboard=True, verbose="auto", write_config=None,
          collective_timeout=600, cluster_wait_timeout=600, record_batches=None, model=None,
          mesh_shape=None, logical_axis_rules=None, input_shards=None, dtype_policy="float32"):
    """Trains a model on a seqio task; returns its summary and the trained model.

    Args:
        model_dir: output folder (checkpoints/, backup/, logs/, operative_config.gin,
            expert_load.png, summary.json).
        task: seqio task or mixture name (`MIXTURE_OR_TASK_NAME`).
        feature_lengths: {"inputs": int, "targets": int} (`TASK_FEATURE_LENGTHS`).
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
        strategy: "default", "mirrored", "multi_worker" or "tpu" (`STRATEGY`).
        tpu_name: TPU for "tpu" (`TPU_NAME`): "local" on a TPU VM, or a name.
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
        expert_load_every: steps between expert-load TensorBoard scalars (0 = never).
        tensorboard: add `keras.callbacks.TensorBoard`.
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
            `MODEL`); default: `keras_moe.models.build_model` as bound in gin.
        mesh_shape: JAX backend: shard the model over a device mesh of this
            shape (`MESH_SHAPE`, e.g. {"data": 2, "expert": 4}; see
            `keras_moe.sharding.configure_mesh`), applied before it is built.
        logical_axis_rules: the mesh's `(logical axis, mesh axes)` rules
            (`LOGICAL_AXIS_RULES`); None: `keras_moe.layouts.DEFAULT_RULES`.
        input_shards: the global batch is this many equal slices, each read
            from its own `seqio.ShardInfo` shard, the shards split over the JAX
            processes (`INPUT_SHARDS`; see `multihost.input_plan`); None: one
            per process (one process: the task read unsharded). Fixing it keeps
            the data stream the same for any number of processes.
        dtype_policy: Keras dtype policy the model is built under
            (`DTYPE_POLICY`, one of `DTYPE_POLICIES`): "float32", or
            "mixed_bfloat16" (float32 weights and optimizer state, bfloat16
            activations and matmuls, float32 routers), or "bfloat16" (weights
            too). The global policy is restored once the model is built.

    Returns:
        a `TrainSummary`: the dict written to summary.json (steps, losses,
        paths), with the trained model as its `.model`.
    """
    from keras_moe.training import callbacks as cb_lib
    from keras_moe.training import data as data_lib
    from keras_moe.training import mesh as mesh_lib
    from keras_moe.training import multihost
    from keras_moe.training import stages
    from keras_moe.training import strategy as strategy_lib

    t_start = time.time()
    # Validate cheap arguments before anything touches TF or the model dir.
    if feature_lengths is None:
        feature_lengths = {"inputs": 128, "targets": 32}
    data_lib.check_feature_lengths(feature_lengths)
    check_dtype_policy(dtype_policy)
    _check_int("batch_size", batch_size, 1)
    _check_int("train_steps", train_steps, 1)
    _check_int("checkpoint_every", checkpoint_every, 1)
    _check_int("keep_checkpoints", keep_checkpoints, 1)
    _check_int("log_every", log_every, 1)
    _check_int("summary_batches", summary_batches, 0)
    _check_int("steps_per_execution", steps_per_execution, 1)
    steps_per_epoch = checkpoint_every if steps_per_epoch is None else steps_per_epoch
    _check_int("steps_per_epoch", steps_per_epoch, 1)
    if backup_every is not None:
        _check_int("backup_every", backup_every, 1)
    mesh_lib.check_mesh(mesh_shape, logical_axis_rules, strategy)
    process_index, process_count = multihost.process_info()
    if process_count > 1 and mesh_shape is None:
        raise TrainingConfigError(
            f"{process_count} JAX processes train one model over a device mesh: bind "
            "MESH_SHAPE (its product = the devices of all processes).")
    input_plan = multihost.input_plan(batch_size, input_shards, process_index, process_count)
    model_dir = prepare_model_dir(model_dir)
    # One seed for everything: model init, and tf.data (whose op seeds combine
    # with the global one, so a resumed run must set the same global seed to
    # see the same stream after `skip`).
    import keras

    keras.utils.set_random_seed(seed)

    strat = strategy_lib.make_strategy(strategy, tpu_name=tpu_name, devices=mirrored_devices,
                                       collective_timeout=collective_timeout,
                                       cluster_wait_timeout=cluster_wait_timeout)
    chief = strategy_lib.is_chief(strat) and process_index == 0
    replicas = strat.num_replicas_in_sync
    if batch_size % replicas:
        raise TrainingConfigError(
            f"BATCH_SIZE={batch_size} is not divisible by the {replicas} replicas of "
            f"STRATEGY={strategy!r}.")
    log(f"strategy {strategy} ({type(strat).__name__}, {replicas} replica(s)); "
        f"global batch {batch_size} = {batch_size // replicas} per replica; "
        f"dtype policy {dtype_policy}")
    shard_ids, num_shards, rows = input_plan
    if process_count > 1 or num_shards > 1:
        log(f"process {process_index} of {process_count}: input shards {shard_ids} of "
            f"{num_shards}, {rows} rows each, of the global batch {batch_size}")
    if process_count > 1 and expert_load_every:
        # The probe runs on process 0 alone; the sharded model needs all of them.
        log("several processes: no expert-load scalars (measure them with keras-moe-eval)")
        expert_load_every = 0
    data_lib.get_task(task)  # Unknown task names fail here, before the model is built.

    mesh = None
    if mesh_shape is not None:
        mesh = mesh_lib.apply_mesh(mesh_shape, logical_axis_rules)
        log(f"device mesh {mesh}: the model is sharded by keras_moe.layouts")
    factory = model
    with dtype_policy_scope(dtype_policy):  # init_checkpoint's model too (resume)
        with strat.scope():
            model = build_compiled_model(optimizer, jit_compile, steps_per_execution, factory)
            model.optimizer.build(model.trainable_variables)
        shards = mesh_lib.shard_report(model) if mesh else None
        for name, full, local in shards or ():
            log(f"  {name}: {full} -> {local} on one device")
        manager, backup_dir, resumed, start_step = stages.resume(
            model, model_dir, keep_checkpoints, init_checkpoint, factory,
            sharded=process_count > 1, primary=chief)
    skip = resumed["batches_consumed"] if resumed else 0

    def dataset(skip_batches):
        return data_lib.make_process_dataset(task, feature_lengths, "train", input_plan,
                                             pack=pack, shuffle=shuffle, seed=seed, repeat=True,
                                             skip_batches=skip_batches)

    def train_dataset(skip_batches):
        ds = dataset(skip_batches)
        return data_lib.record_batches(ds, record_batches) if record_batches else ds

    first_batch = data_lib.check_not_empty(dataset(0), task, "train")
    summary_data, summary_split = stages.summary_dataset(
        lambda split: data_lib.make_process_dataset(task, feature_lengths, split, input_plan,
                                                    pack=pack, shuffle=False, seed=seed,
                                                    repeat=False),
        eval_split, summary_batches, dataset(0))

    # Everything validated: now the model dir gets written.
    if chief and write_config is not None:
        write_config(model_dir)
    log_root = os.path.join(model_dir, "logs") if chief else tempfile.mkdtemp(prefix="kmoe-logs-")
    probe = next(iter(summary_data)) if summary_data is not None and expert_load_every else None
    logger = cb_lib.TrainingLogger(
        os.path.join(log_root, "train"),
        batch_size * (feature_lengths["inputs"] + feature_lengths["targets"]), log_every,
        total_steps=train_steps, probe_batch=probe, expert_load_every=expert_load_every,
        enabled=chief)
    callbacks = stages.make_callbacks(manager, backup_dir, log_root, chief, logger,
                                      checkpoint_every, backup_every, tensorboard, log_every)

    eval_start = stages.evaluate(model, summary_data) if start_step == 0 else None
    if verbose == "auto":
        verbose = 1 if sys.stdout.isatty() else 2
    if eval_start is None:  # resumed, or no summary data: nothing built the metrics yet
        stages.build_metrics(model, first_batch)
    train_seconds = stages.fit(model, train_dataset, start_step, skip, train_steps,
                               steps_per_epoch, callbacks, verbose, strategy, collective_timeout)
    end_step = int(model.optimizer.iterations.numpy())
    eval_end = stages.evaluate(model, summary_data)
    plot_path = None
    if chief and summary_data is not None:
        shared_with = (f"{process_count} processes" if process_count > 1
                       else "multi_worker" if strategy == "multi_worker" else None)
        plot_path = stages.plot_expert_load(model, summary_data, summary_split, model_dir,
                                            end_step, shared_with)

    history = logger.history
    latest = manager.latest()
    summary = {
        "task": task, "strategy": strategy, "replicas": replicas, "dtype_policy": dtype_policy,
        "start_step": start_step, "end_step": end_step,
        "resumed_from": resumed["path"] if resumed else None,
        "first_step_loss": history[0][1] if history and start_step == 0 else None,
        "last_epoch_loss": history[-1][1] if history else None,
        "eval_split": summary_split,
        "eval_start": eval_start, "eval_end": eval_end,
        "train_seconds": train_seconds, "wall_seconds": time.time() - t_start,
        "checkpoint": latest["path"] if latest else None,
        "tensorboard": log_root, "expert_load_plot": plot_path,
        "operative_config": os.path.join(model_dir, "operative_config.gin"),
        "history": history, "mesh": mesh, "processes": process_count,
        "input_shards": num_shards,
        "shards": [[n, list(f), list(l)] for n, f, l in shards] if shards else None,
    }
    if chief:
        ckpt_lib.atomic_write_text(os.path.join(model_dir, "summary.json"),
                                   json.dumps(summary, indent=1))
    summary = TrainSummary(summary)
    summary.model = model
    return summary


def format_summary(summary):
    """Human-readable end-of-run summary."""
    lines = ["", "=" * 72, "keras_moe training summary", "=" * 72]
    lines.append(f"task            {summary['task']}  (strategy {summary['strategy']}, "
                 f"{summary['replicas']} replica(s))")
    resumed = f"  (resumed from {summary['resumed_from']})" if summary["resumed_from"] else ""
    if summary.get("mesh"):
        lines.append(f"device mesh     {summary['mesh']}")
        for name, full, local in summary["shards"]:
            lines.append(f"  {name}: {tuple(full)} -> {tuple(local)} on one device")
    lines.append(f"steps           {summary['start_step']} -> {summary['end_step']}{resumed}")
    if summary["first_step_loss"] is not None:
        lines.append(f"train loss      first step {summary['first_step_loss']:.4f}, "
                     f"last epoch mean {summary['last_epoch_loss']:.4f}")
    elif summary["last_epoch_loss"] is not None:
        lines.append(f"train loss      last epoch mean {summary['last_epoch_loss']:.4f}")
    if summary["eval_end"]:
        start = summary["eval_start"]
        before = f"{start['loss']:.4f} -> " if start else ""
        lines.append(f"{summary['eval_split']} loss{' ' * max(1, 6 - len(summary['eval_split']))}"
                     f"{before}{summary['eval_end']['loss']:.4f} "
                     f"(accuracy {summary['eval_end'].get('accuracy', math.nan):.3f})")
    lines.append(f"time            {summary['train_seconds']:.0f} s training, "
                 f"{summary['wall_seconds']:.0f} s in total")
    lines.append(f"checkpoint      {summary['checkpoint']}")
    lines.append(f"tensorboard     tensorboard --logdir {summary['tensorboard']}")
    lines.append(f"expert load     {summary['expert_load_plot']}")
    lines.append(f"gin config      {summary['operative_config']}")
    lines.append("=" * 72)
    return "\n".join(lines)
