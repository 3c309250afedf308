"""A readable console for the command-line tools: short progress lines.

(Their start-up noise is filtered by `keras_moe.startup`.)

* `CompactProgbar`: Keras' progress bar showing loss, accuracy and the
  learning rate; the per-layer router statistics go to `router_table` and
  TensorBoard instead of one very long line.
"""

import keras


def short_logs(logs, learning_rate=None):
    """The progress-bar subset of Keras logs: no per-layer (`a/b`) entries,
    plus the learning rate.

    Example:
    >>> short_logs({"loss": 2.0, "encoder_layer_1/ffn/z_loss": 0.1}, 0.003)
    {'loss': 2.0, 'lr': 0.003}
    """
    out = {k: v for k, v in (logs or {}).items() if "/" not in k}
    if learning_rate is not None:
        out["lr"] = learning_rate
    return out


class CompactProgbar(keras.callbacks.ProgbarLogger):
    """Keras' progress bar with loss, accuracy and the learning rate only.

    Passed in `fit(callbacks=...)`, it replaces the default progress bar; the
    full logs still reach every other callback (TensorBoard, History).
    """

    def _lr(self):
        from keras_moe.training.run import schedules

        optimizer = self.model.optimizer
        step = int(keras.ops.convert_to_numpy(optimizer.iterations))
        return schedules.learning_rate_at(optimizer, step)

    def on_train_batch_end(self, batch, logs=None):
        super().on_train_batch_end(batch, short_logs(logs, self._lr()))

    def on_epoch_end(self, epoch, logs=None):
        super().on_epoch_end(epoch, short_logs(logs, self._lr()))

    def on_test_batch_end(self, batch, logs=None):
        super().on_test_batch_end(batch, short_logs(logs))

    def on_test_end(self, logs=None):
        super().on_test_end(short_logs(logs))


ROUTER_COLUMNS = (("dropped_fraction", "dropped", "{:.1%}"),
                  ("load_imbalance", "imbalance", "{:.2f}"),
                  ("max_violation", "MaxVio", "{:.2f}"),
                  ("router_confidence", "confidence", "{:.3f}"),
                  ("output_rms_ratio", "out/in rms", "{:.3f}"))


def router_table(scalars, indent="  "):
    """A per-layer table of router statistics from `{"moe/<layer>/<stat>": value}`.

    Example:
    >>> print(router_table({"moe/enc/ffn/dropped_fraction": 0.25,
    ...                     "moe/enc/ffn/load_imbalance": 1.5, "learning_rate": 0.1}))
      MoE layer  dropped  imbalance  MaxVio  confidence  out/in rms
      enc/ffn      25.0%       1.50       -           -           -
    """
    layers = {}
    for key, value in scalars.items():
        if key.startswith("moe/") and key.count("/") >= 2:
            layer, stat = key[len("moe/"):].rsplit("/", 1)
            layers.setdefault(layer, {})[stat] = value
    if not layers:
        return ""
    names = sorted(layers, key=lambda n: (not n.startswith("encoder"), n))
    width = max(len("MoE layer"), *(len(n) for n in names))
    header = [f"{'MoE layer':<{width}}"] + [title for _, title, _ in ROUTER_COLUMNS]
    rows = [header]
    for name in names:
        stats = layers[name]
        rows.append([f"{name:<{width}}"] + [
            fmt.format(stats[stat]) if stat in stats else "-" for stat, _, fmt in ROUTER_COLUMNS])
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    lines = []
    for row in rows:
        cells = [row[0].ljust(widths[0])] + [
            c.rjust(w) for c, w in zip(row[1:], widths[1:], strict=False)]
        lines.append(indent + "  ".join(cells).rstrip())
    return "\n".join(lines)
