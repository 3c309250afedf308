"""TensorBoard scalars and console lines, and the expert-load history.

`TrainingLogger` writes two TensorBoard runs under `<log_dir>`, one tag per
metric, the same tag in both (TensorBoard overlays the two curves):
  * `train/`, every `log_every` steps: every metric of `fit`'s logs (`loss`,
    `accuracy`, `neg_log_perplexity`: the running mean of the epoch, as Keras
    reports it), `learning_rate`, `tokens_per_second` (encoder + decoder
    positions of the global batch, padding included) and `steps_per_second`;
    per MoE layer (by layer path, so the encoder's and decoder's `ffn` layers
    do not collide) `moe/<path>/<statistic>`: `dropped_fraction`,
    `load_imbalance`, `max_violation` (MaxVio), `router_entropy`,
    `router_confidence`, `aux_loss`, `z_loss`, `output_rms_ratio` from the
    layer's metric trackers (`T5Config.track_router_metrics=True`); per MoE
    layer `moe/<path>/expert_load/expert_<i>` (each expert's share of the
    selected choices) and `moe/<path>/expert_load/max_violation` from a
    one-batch eval pass on a held batch (every `expert_load_every` steps;
    0 = never).
  * `validation/`, at each evaluation (`fit`'s validation at epoch ends, and
    `write_validation`): the evaluation's metrics under the same tags.
With `history_dir`, each expert-load measurement is also appended to
`expert_load_history.json` there and drawn in `expert_load_history.png`
(`keras_moe.training.run.load_history`); a resumed run keeps the measurements up
to its checkpoint's step and extends them.
It also prints, per log step, a line (loss, learning rate, tokens/s) and a
per-layer router table (`console.router_table`), and keeps the loss history for the
end-of-run summary.
"""

import os
import sys
import time

import keras
import numpy as np

from keras_moe.training import console
from keras_moe.training.errors import NonFiniteLossError
from keras_moe.training.run import expert_load as expert_load_lib
from keras_moe.training.run import load_history, schedules


class TrainingLogger(keras.callbacks.Callback):
    """Writes the TensorBoard scalars, the console lines and the expert-load history.

    Args:
        log_dir: folder of the TensorBoard runs (`train/`, `validation/`); None:
            no TensorBoard output.
        tokens_per_step: token positions of a global batch (for tokens/s).
        log_every: steps between log lines and training scalars.
        total_steps: the run's last step (always logged).
        probe_batch: the held batch of the expert-load measurements.
        expert_load_every: steps between expert-load measurements (0 = never).
        enabled: False on the workers that write nothing.
        stream: where the console lines go (default stdout).
        history_dir: folder of `expert_load_history.json` / `.png` (None: not kept).
    """

    def __init__(
        self,
        log_dir,
        tokens_per_step,
        log_every=10,
        total_steps=None,
        probe_batch=None,
        expert_load_every=0,
        enabled=True,
        stream=None,
        history_dir=None,
    ):
        super().__init__()
        self.log_dir = log_dir
        self.tokens_per_step = int(tokens_per_step)
        self.log_every = max(int(log_every), 1)
        self.total_steps = total_steps
        self.probe_batch = probe_batch
        self.expert_load_every = int(expert_load_every or 0)
        self.enabled = enabled
        self.stream = stream or sys.stdout
        self._legend_shown = False  # the router table says what its columns mean once
        self.history_dir = history_dir
        self.history = []  # (step, running loss)
        self.load_history = None  # expert-load entries, read at the first train begin
        self._writers = {}
        self._t0 = None
        self._step0 = None

    # -------------------------------------------------------------- helpers
    def _step(self):
        return int(keras.ops.convert_to_numpy(self.model.optimizer.iterations))

    def _writer_or_none(self, run="train"):
        if not self.enabled or self.log_dir is None:
            return None
        if run not in self._writers:
            import tensorflow as tf

            self._writers[run] = tf.summary.create_file_writer(os.path.join(self.log_dir, run))
        return self._writers[run]

    def _write(self, run, step, scalars):
        writer = self._writer_or_none(run)
        if writer is None:
            return
        import tensorflow as tf

        # Summaries are recorded whatever `tf.summary.record_if` condition an
        # outer callback set for its own writer.
        with writer.as_default(step=step), tf.summary.record_if(True):
            for name, value in scalars.items():
                tf.summary.scalar(name, value)
        writer.flush()

    def metric_tags(self):
        """`{Keras metric name: tag}` of the MoE layers' trackers
        (`encoder_layer_1/ffn/z_loss` -> `moe/encoder_layer_1/ffn/z_loss`)."""
        tags = {}
        for path, layer in expert_load_lib.moe_layers(self.model).items():
            for name, tracker in (getattr(layer, "_trackers", None) or {}).items():
                tags[tracker.name] = f"moe/{path}/{name}"
        return tags

    def tagged(self, logs):
        """Keras logs (without `val_`) as `{tag: float}`: the router trackers under
        their `moe/<path>/<statistic>` tag, the other metrics under their name."""
        tags = self.metric_tags()
        return {tags.get(k, k): float(np.asarray(v)) for k, v in (logs or {}).items()}

    def router_scalars(self):
        """`{"moe/<layer path>/<statistic>": value}` from the MoE layers' trackers."""
        out = {}
        for path, layer in expert_load_lib.moe_layers(self.model).items():
            trackers = getattr(layer, "_trackers", None) or {}
            for name, tracker in trackers.items():
                out[f"moe/{path}/{name}"] = float(keras.ops.convert_to_numpy(tracker.result()))
        return out

    def write_validation(self, step, results):
        """Writes an evaluation's `results` (`{metric: value}`, Keras names) to the
        `validation/` run at `step`."""
        self._write("validation", step, self.tagged(results))

    # ------------------------------------------------------------ callbacks
    def on_train_begin(self, logs=None):
        self._t0 = time.time()
        self._step0 = self._step()
        if self.load_history is None:
            self.load_history = []
            if self.enabled and self.history_dir is not None:
                self.load_history = load_history.read_history(
                    self.history_dir, up_to_step=self._step0
                )

    def _measure_expert_load(self, step, router):
        """Measures the held batch's load; returns the expert-load scalars."""
        measured = expert_load_lib.measure_router_pass(self.model, [self.probe_batch])
        scalars = {}
        for path, m in measured.items():
            for i, value in enumerate(m["load"]):
                scalars[f"moe/{path}/expert_load/expert_{i}"] = float(value)
            scalars[f"moe/{path}/expert_load/max_violation"] = expert_load_lib.max_violation(
                m["load"]
            )
        if measured and self.enabled and self.history_dir is not None:
            entry = {
                "step": step,
                "load": {p: [float(x) for x in m["load"]] for p, m in measured.items()},
                "dropped_fraction": {p: float(m["dropped_fraction"]) for p, m in measured.items()},
            }
            train_drop = {
                p: router[f"moe/{p}/dropped_fraction"]
                for p in measured
                if f"moe/{p}/dropped_fraction" in router
            }
            if train_drop:
                entry["train_dropped_fraction"] = train_drop
            self.load_history = [e for e in self.load_history if e["step"] != step] + [entry]
            load_history.write_history(self.history_dir, self.load_history)
        return scalars

    def on_train_batch_end(self, batch, logs=None):
        step = self._step()
        logs = logs or {}
        if "loss" in logs:
            if not self.history or self.history[-1][0] != step:
                self.history.append((step, float(logs["loss"])))
        log_step = step % self.log_every == 0 or step == self.total_steps
        load_step = (
            self.probe_batch is not None
            and self.expert_load_every
            and step % self.expert_load_every == 0
        )
        if not log_step and not load_step:
            return
        router = self.router_scalars()
        scalars = {}
        if log_step:
            now = time.time()
            done = step - self._step0
            elapsed = max(now - self._t0, 1e-9)
            scalars = {
                "learning_rate": schedules.learning_rate_at(self.model.optimizer, step),
                "steps_per_second": done / elapsed,
                "tokens_per_second": done * self.tokens_per_step / elapsed,
            }
            scalars.update(self.tagged(logs))
            scalars.update(router)
        if load_step:
            scalars.update(self._measure_expert_load(step, router))
        self._write("train", step, scalars)
        if self.enabled and log_step:
            total = f"/{self.total_steps}" if self.total_steps else ""
            loss = f" loss {scalars['loss']:.4f}" if "loss" in scalars else ""
            table = console.router_table(router, legend=not self._legend_shown)
            self._legend_shown = self._legend_shown or bool(table)
            print(
                f"\n[keras_moe] step {step}{total}{loss} lr {scalars['learning_rate']:.3g} "
                f"tokens/s {scalars['tokens_per_second']:.0f}" + (f"\n{table}" if table else ""),
                file=self.stream,
                flush=True,
            )

    def on_epoch_end(self, epoch, logs=None):
        results = {k[len("val_") :]: v for k, v in (logs or {}).items() if k.startswith("val_")}
        if results:
            self.write_validation(self._step(), results)

    def on_train_end(self, logs=None):
        for writer in self._writers.values():
            writer.flush()


class NonFiniteLossGuard(keras.callbacks.Callback):
    """Stops training with `NonFiniteLossError` naming the step when the loss is NaN/Inf.

    Unlike `keras.callbacks.TerminateOnNaN` (which stops quietly and lets the
    job exit 0), this raises; put it first in the callback list so that no
    later callback (the checkpoint writers) runs for the bad step.

    Args:
        last_checkpoint: optional callable returning the newest checkpoint path
            (named in the message).
    """

    def __init__(self, last_checkpoint=None):
        super().__init__()
        self.last_checkpoint = last_checkpoint

    def on_train_batch_end(self, batch, logs=None):
        loss = (logs or {}).get("loss")
        if loss is None:
            return
        loss = float(np.asarray(loss))
        if not np.isfinite(loss):
            step = int(keras.ops.convert_to_numpy(self.model.optimizer.iterations))
            self.model.stop_training = True
            raise NonFiniteLossError(
                step, loss, self.last_checkpoint() if self.last_checkpoint else None
            )
