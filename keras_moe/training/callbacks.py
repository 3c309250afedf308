"""TensorBoard scalars and console lines beyond Keras' own callbacks.

`TrainingLogger` writes, every `log_every` steps, to `<log_dir>` (the same
`train` folder `keras.callbacks.TensorBoard` uses, a separate event file):
  * `loss` (running mean of the epoch, as Keras reports it) and `step_loss`,
  * `learning_rate`,
  * `tokens_per_second` (encoder + decoder positions of the global batch,
    padding included) and `steps_per_second`,
  * per MoE layer (by layer path, so the encoder's and decoder's `ffn` layers
    do not collide): `dropped_fraction`, `load_imbalance`, `max_violation`
    (MaxVio), `router_entropy`,
    `router_confidence`, `aux_loss`, `z_loss` from the layer's metric
    trackers (`T5Config.track_router_metrics=True`),
  * per MoE layer `expert_load/expert_<i>` (each expert's share of the
    selected choices) and `expert_load/max_violation` from a one-batch eval
    pass on a held batch (every `expert_load_every` steps; 0 = never).
It also prints, per log step, a line (loss, learning rate, tokens/s) and a
per-layer router table (`console.router_table`), and keeps the loss history for the
end-of-run summary.
"""

import sys
import time

import keras
import numpy as np

from keras_moe.training import console
from keras_moe.training import expert_load as expert_load_lib
from keras_moe.training import schedules


class TrainingLogger(keras.callbacks.Callback):
    def __init__(self, log_dir, tokens_per_step, log_every=10, total_steps=None,
                 probe_batch=None, expert_load_every=0, enabled=True, stream=None):
        super().__init__()
        self.log_dir = log_dir
        self.tokens_per_step = int(tokens_per_step)
        self.log_every = max(int(log_every), 1)
        self.total_steps = total_steps
        self.probe_batch = probe_batch
        self.expert_load_every = int(expert_load_every or 0)
        self.enabled = enabled
        self.stream = stream or sys.stdout
        self.history = []  # (step, running loss)
        self._writer = None
        self._t0 = None
        self._step0 = None

    # -------------------------------------------------------------- helpers
    def _step(self):
        return int(keras.ops.convert_to_numpy(self.model.optimizer.iterations))

    def _writer_or_none(self):
        if not self.enabled or self.log_dir is None:
            return None
        if self._writer is None:
            import tensorflow as tf

            self._writer = tf.summary.create_file_writer(self.log_dir)
        return self._writer

    def router_scalars(self):
        """`{"<layer path>/<statistic>": value}` from the MoE layers' trackers."""
        out = {}
        for path, layer in expert_load_lib.moe_layers(self.model).items():
            trackers = getattr(layer, "_trackers", None) or {}
            for name, tracker in trackers.items():
                out[f"moe/{path}/{name}"] = float(keras.ops.convert_to_numpy(tracker.result()))
        return out

    # ------------------------------------------------------------ callbacks
    def on_train_begin(self, logs=None):
        self._t0 = time.time()
        self._step0 = self._step()

    def on_train_batch_end(self, batch, logs=None):
        step = self._step()
        logs = logs or {}
        if "loss" in logs:
            if not self.history or self.history[-1][0] != step:
                self.history.append((step, float(logs["loss"])))
        if step % self.log_every and step != self.total_steps:
            return
        now = time.time()
        done = step - self._step0
        elapsed = max(now - self._t0, 1e-9)
        scalars = {
            "learning_rate": schedules.learning_rate_at(self.model.optimizer, step),
            "steps_per_second": done / elapsed,
            "tokens_per_second": done * self.tokens_per_step / elapsed,
        }
        if "loss" in logs:
            scalars["loss"] = float(logs["loss"])
        scalars.update(self.router_scalars())
        loads = {}
        if self.probe_batch is not None and self.expert_load_every and \
                step % self.expert_load_every == 0:
            loads = expert_load_lib.measure_expert_load(self.model, [self.probe_batch])
        writer = self._writer_or_none()
        if writer is not None:
            import tensorflow as tf

            with writer.as_default(step=step):
                for name, value in scalars.items():
                    tf.summary.scalar(name, value)
                for path, load in loads.items():
                    for i, value in enumerate(load):
                        tf.summary.scalar(f"moe/{path}/expert_load/expert_{i}", float(value))
                    tf.summary.scalar(f"moe/{path}/expert_load/max_violation",
                                      expert_load_lib.max_violation(load))
            writer.flush()
        if self.enabled:
            total = f"/{self.total_steps}" if self.total_steps else ""
            loss = f" loss {scalars['loss']:.4f}" if "loss" in scalars else ""
            table = console.router_table(scalars)
            print(f"\n[keras_moe] step {step}{total}{loss} lr {scalars['learning_rate']:.3g} "
                  f"tokens/s {scalars['tokens_per_second']:.0f}" + (f"\n{table}" if table else ""),
                  file=self.stream, flush=True)

    def on_train_end(self, logs=None):
        if self._writer is not None:
            self._writer.flush()


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
            from keras_moe.training.errors import NonFiniteLossError

            step = int(keras.ops.convert_to_numpy(self.model.optimizer.iterations))
            self.model.stop_training = True
            raise NonFiniteLossError(step, loss, self.last_checkpoint()
                                     if self.last_checkpoint else None)
