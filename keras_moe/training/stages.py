"""The stages of `trainer.train`, in the order it runs them: resume, the
summary data, the callbacks, the fit loop, the expert-load plot."""

import json
import os
import time
import warnings

from keras_moe.training import checkpoint as ckpt_lib
from keras_moe.training.errors import TrainingConfigError
from keras_moe.training.log import log


def resume(model, model_dir, keep_checkpoints, init_checkpoint, model_factory=None,
           sharded=False, primary=True):
    """Restores the newest loadable checkpoint of `model_dir` (step checkpoints or
    preemption backup) into `model`, or else `init_checkpoint` (weights only,
    read into a model of `model_factory`; see `load_init_checkpoint`).
    `sharded` / `primary`: see `CheckpointManager` (several JAX processes).

    Returns:
        `(manager, backup_dir, resumed, start_step)`: the step-checkpoint
        manager, the backup folder, the restored checkpoint's metadata (None
        when starting fresh) and the optimizer step to continue from.
    """
    manager = ckpt_lib.CheckpointManager(os.path.join(model_dir, "checkpoints"), keep_checkpoints,
                                         sharded=sharded, primary=primary)
    backup_dir = os.path.join(model_dir, "backup")
    candidates = manager.all() + ckpt_lib.CheckpointManager(backup_dir).all()
    resumed = None
    if candidates:
        resumed = ckpt_lib.restore_newest(model, candidates, log=log)
        if resumed is None:
            raise TrainingConfigError(
                f"model_dir {model_dir} holds checkpoints but none of them can be loaded "
                "(all corrupt, see above); move them away to start from step 0.")
    elif init_checkpoint:
        load_init_checkpoint(model, init_checkpoint, model_factory)
    start_step = int(model.optimizer.iterations.numpy())
    if resumed is None:
        log("no checkpoint in model_dir: starting from step 0")
        return manager, backup_dir, None, start_step
    if start_step != resumed["step"]:
        raise TrainingConfigError(
            f"checkpoint {resumed['path']} restored step {start_step}, its metadata says "
            f"{resumed['step']}; the checkpoint is inconsistent.")
    log(f"resumed from checkpoint {resumed['path']} at step {start_step} "
        f"(skipping {resumed['batches_consumed']} consumed batches)")
    return manager, backup_dir, resumed, start_step


def load_init_checkpoint(model, path, build_source=None):
    """Initialises the model weights (not the optimizer) from `path`.

    `path` may be a `.weights.h5` file, a keras_moe model dir or checkpoint
    folder (its newest checkpoint), or a Hugging Face T5/SwitchTransformers
    folder (`config.json` + `*.safetensors`, via `keras_moe.convert.from_hf`).
    A keras_moe checkpoint is read into `build_source()` (default: gin's
    `build_model`), the factory the trained model came from.
    """
    from keras_moe.models import gin_configurables

    if os.path.isdir(path) and os.path.isfile(os.path.join(path, "config.json")):
        from keras_moe.convert import from_hf

        source = from_hf(path)
        kind = "Hugging Face checkpoint"
    else:
        weights = ckpt_lib.resolve_checkpoint(path, "init_checkpoint")
        source = (build_source or gin_configurables.build_model)()
        try:
            source.load_weights(weights)
        except (ValueError, KeyError, OSError) as e:
            raise TrainingConfigError(
                f"init_checkpoint {weights} does not fit the configured model: {e}") from None
        kind = "checkpoint"
        path = weights
    src, dst = source.weights, model.weights
    if len(src) != len(dst) or any(tuple(a.shape) != tuple(b.shape)
                                   for a, b in zip(src, dst, strict=False)):
        raise TrainingConfigError(
            f"init_checkpoint {path!r} ({kind}) has a different architecture than the "
            "configured model; bind the same model gin file.")
    for a, b in zip(src, dst, strict=False):
        b.assign(a.value)
    log(f"initialised the model from {kind} {path}")


def summary_dataset(make_dataset, eval_split, summary_batches, train_dataset):
    """`(finite dataset, split)` of `summary_batches` batches for the start/end
    loss and the expert-load plot: from `eval_split`, or from the training
    stream when that split is missing; `(None, None)` when `summary_batches` is 0.

    Args:
        make_dataset: `split -> one unshuffled pass over that split`.
        eval_split: the split to prefer.
        summary_batches: how many batches.
        train_dataset: `() -> the training stream` (the fallback), called only
            when `eval_split` is missing (building a seqio pipeline costs seconds).
    """
    from keras_moe.training import data as data_lib

    if not summary_batches:
        return None, None
    try:
        data = make_dataset(eval_split).take(summary_batches)
        data_lib.check_not_empty(data, "", eval_split)
        split = eval_split
    except TrainingConfigError:
        data, split = train_dataset().take(summary_batches), "train"
    return data_lib.finite(data), split


def make_callbacks(manager, backup_dir, chief, logger, checkpoint_every, backup_every,
                   tensorboard):
    """The fit callbacks: NaN guard, progress bar, `logger` (its TensorBoard output
    off unless `tensorboard` is asked for and installed), step checkpoints and
    preemption backup."""
    from keras_moe.training import callbacks as cb_lib
    from keras_moe.training import console

    def last_checkpoint():
        meta = manager.latest()
        return meta["path"] if meta else None

    # Sharded checkpoints are written by every process (each its own shards).
    writes = chief or manager.sharded
    callbacks = [
        cb_lib.NonFiniteLossGuard(last_checkpoint),  # First: raises before any checkpoint.
        console.CompactProgbar(),  # Router statistics go to the logger's table instead.
        logger,
        ckpt_lib.StepCheckpoint(manager, checkpoint_every, enabled=writes, log=log),
        ckpt_lib.PreemptionBackup(backup_dir, save_freq=backup_every or "epoch", enabled=writes,
                                  sharded=manager.sharded, primary=chief),
    ]
    # `logger` writes the TensorBoard runs (train/, validation/) itself: Keras'
    # TensorBoard callback would add `batch_`/`epoch_` copies of every metric, and
    # its `record_if` condition silences other writers between its own steps.
    if tensorboard and not _has_tensorboard():
        log("the tensorboard package is not installed: no TensorBoard logs "
            "(pip install tensorboard)")
        tensorboard = False
    if not tensorboard:
        logger.log_dir = None
    return callbacks


def _has_tensorboard():
    try:
        import tensorboard  # noqa: F401
    except ImportError:
        return False
    return True


def fit_segments(start, total, steps_per_epoch):
    """[(initial_epoch, epochs, steps_per_epoch, start_step)] covering steps start..total.

    Example:
    >>> fit_segments(3, 10, 4)  # a partial epoch to the boundary, then whole ones
    [(0, 1, 1, 3), (1, 2, 4, 4), (2, 3, 2, 8)]
    """
    calls = []
    step = start
    while step < total:
        n = min(steps_per_epoch - step % steps_per_epoch, total - step)
        epoch = step // steps_per_epoch
        if calls and n == steps_per_epoch and calls[-1][2] == steps_per_epoch \
                and calls[-1][1] == epoch:
            first, _, spe, s0 = calls[-1]
            calls[-1] = (first, epoch + 1, spe, s0)
        else:
            calls.append((epoch, epoch + 1, n, step))
        step += n
    return calls


def fit(model, train_dataset, start_step, skip, train_steps, steps_per_epoch, callbacks,
        verbose, strategy, collective_timeout, validation_data=None, validation_freq=1):
    """`model.fit` from `start_step` to `train_steps`, epoch-aligned, on the
    stream `train_dataset(skip_batches)` past the `skip` batches a resumed run
    consumed, evaluating on the finite `validation_data` (None: never) at the end
    of every `validation_freq`-th epoch. A failed collective under "multi_worker"
    becomes a `WorkerFailureError` that says how to resume. Returns the training
    seconds."""
    import tensorflow as tf

    start = time.time()
    peer_errors = (tf.errors.UnavailableError, tf.errors.DeadlineExceededError,
                   tf.errors.CancelledError, tf.errors.AbortedError)
    try:
        for initial_epoch, epochs, spe, first_step in fit_segments(start_step, train_steps,
                                                                    steps_per_epoch):
            validation = {}
            if validation_data is not None and validation_freq:
                validation = {"validation_data": validation_data,
                              "validation_freq": validation_freq}
            model.fit(train_dataset(skip + first_step - start_step),
                      initial_epoch=initial_epoch, epochs=epochs, steps_per_epoch=spe,
                      callbacks=callbacks, verbose=verbose,
                      shuffle=False,  # seqio already shuffles the stream, by seed.
                      **validation)
    except peer_errors as e:
        if strategy != "multi_worker":
            raise
        from keras_moe.training.errors import WorkerFailureError

        step = int(model.optimizer.iterations.numpy())
        first_line = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise WorkerFailureError(
            f"multi_worker: a collective failed at step {step} ({type(e).__name__}: "
            f"{first_line[:300]}); a peer worker probably died or is unreachable "
            f"(collective_timeout={collective_timeout} s). Restart all workers with the "
            "same command to resume from the last checkpoint.") from None
    return time.time() - start


def build_metrics(model, batch):
    """Builds the compiled loss and metrics on `batch` (JAX backend) before `fit`.

    Keras's JAX `fit` builds whatever is not built yet from a batch it takes
    off the training stream, which shifts the run's data by one batch. A test
    step on a batch of a separate stream builds them instead (the trainer
    calls this when no start evaluation has built them).
    """
    import keras
    import numpy as np

    if keras.backend.backend() == "jax":
        model.test_on_batch(*keras.tree.map_structure(np.asarray, batch))


def evaluate(model, data):
    """`model.evaluate` on the finite `data` as a dict of floats (None without data)."""
    if data is None:
        return None
    with warnings.catch_warnings():  # "ran out of data": the summary set is finite.
        warnings.simplefilter("ignore")
        out = model.evaluate(data, verbose=0, return_dict=True)
    return {k: float(v) for k, v in out.items()}


def plot_expert_load(model, data, split, model_dir, step, shared_with=None):
    """Writes `expert_load.png` / `.json` of the tokens of `data`; returns the
    plot's path (None when the model has no experts or is `shared_with` other
    workers or processes, e.g. "multi_worker", "2 processes")."""
    from keras_moe.training import expert_load as load_lib

    if shared_with:
        # A pass on the chief alone would need the others for the MoE layers'
        # metric variables or the sharded weights (collectives): skipped.
        log(f"{shared_with}: no expert-load plot (measure it with keras-moe-eval)")
        return None
    loads = load_lib.measure_expert_load(model, data)
    if not loads:
        return None
    path = os.path.join(model_dir, "expert_load.png")
    load_lib.plot_expert_load(loads, path, title=f"Expert load at step {step} ({split})")
    ckpt_lib.atomic_write_text(
        os.path.join(model_dir, "expert_load.json"),
        json.dumps({k: [float(x) for x in v] for k, v in loads.items()}, indent=1))
    return path
