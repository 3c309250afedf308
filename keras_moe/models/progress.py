"""Short progress lines for `fit` and `evaluate` of a model with MoE layers.

Keras' progress bar prints every log, and each MoE layer logs eight router
statistics under long names: one line of a thousand characters or more. Here
the bar shows loss and accuracy, and the router statistics come as a table,
one row per MoE layer, with a legend (`router_table`). Every other callback
(TensorBoard, History) still gets the full logs.
"""

from __future__ import annotations

import textwrap
import warnings
from typing import Any

import keras

from keras_moe.mixin_bases import ModelMixinBase

ROUTER_COLUMNS = (
    ("dropped_fraction", "dropped", "{:.1%}"),
    ("load_imbalance", "imbalance", "{:.2f}"),
    ("max_violation", "MaxVio", "{:.2f}"),
    ("router_confidence", "confidence", "{:.3f}"),
    ("output_rms_ratio", "out/in rms", "{:.3f}"),
)
STATISTICS = {stat for stat, _, _ in ROUTER_COLUMNS}
ROUTER_LEGEND = (
    "dropped: tokens no expert took (capacity); imbalance: the busiest expert's "
    "share of first choices x experts (1 = even); MaxVio: the busiest expert's "
    "selections over the mean, minus 1 (0 = even); confidence: mean top router "
    "probability; out/in rms: the MoE branch's output over its input"
)


def short_logs(logs: dict | None, learning_rate: float | None = None) -> dict:
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


def router_table(scalars: dict[str, Any], indent: str = "  ", legend: bool = False) -> str:
    """A per-layer table of router statistics from `{"moe/<layer>/<stat>": value}`
    (TensorBoard's tags) or Keras' `{"<layer>/<stat>": value}` logs; with `legend`,
    a line saying what each column means.

    Example:
    >>> print(router_table({"moe/enc/ffn/dropped_fraction": 0.25,
    ...                     "moe/enc/ffn/load_imbalance": 1.5, "learning_rate": 0.1}))
      MoE layer  dropped  imbalance  MaxVio  confidence  out/in rms
      enc/ffn      25.0%       1.50       -           -           -
    """
    layers: dict[str, dict[str, float]] = {}
    for key, value in scalars.items():
        if key.startswith("moe/") and key.count("/") >= 2:
            layer, stat = key[len("moe/") :].rsplit("/", 1)
        elif "/" in key and not key.startswith("val_") and key.rsplit("/", 1)[1] in STATISTICS:
            layer, stat = key.rsplit("/", 1)
        else:
            continue
        layers.setdefault(layer, {})[stat] = value
    if not layers:
        return ""
    names = sorted(layers, key=lambda n: (not n.startswith("encoder"), n))
    width = max(len("MoE layer"), *(len(n) for n in names))
    header = [f"{'MoE layer':<{width}}"] + [title for _, title, _ in ROUTER_COLUMNS]
    rows = [header]
    for name in names:
        stats = layers[name]
        rows.append(
            [f"{name:<{width}}"]
            + [
                fmt.format(float(stats[stat])) if stat in stats else "-"
                for stat, _, fmt in ROUTER_COLUMNS
            ]
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    lines = []
    for row in rows:
        cells = [row[0].ljust(widths[0])] + [
            c.rjust(w) for c, w in zip(row[1:], widths[1:], strict=False)
        ]
        lines.append(indent + "  ".join(cells).rstrip())
    if legend:
        lines += textwrap.wrap(
            "(" + ROUTER_LEGEND + ")",
            width=96,
            initial_indent=indent,
            subsequent_indent=indent + " ",
        )
    return "\n".join(lines)


class CompactProgbar(keras.callbacks.ProgbarLogger):
    """Keras' progress bar without the per-layer router statistics; after each epoch
    of `fit` (verbose 1 or 2) a table of them (`router_table`, its legend the first time).

    Passed in `fit(callbacks=...)` it replaces Keras' default bar (`EncoderDecoder.fit`
    adds one unless a progress bar is given).
    """

    def __init__(self, epoch_table: bool = True) -> None:
        super().__init__()
        self.epoch_table = epoch_table
        self._legend_shown = False

    def learning_rate(self) -> float | None:
        """A learning rate for the bar; None: none shown."""
        return None

    def on_train_batch_end(self, batch, logs=None):
        super().on_train_batch_end(batch, short_logs(logs, self.learning_rate()))

    def on_epoch_end(self, epoch, logs=None):
        super().on_epoch_end(epoch, short_logs(logs, self.learning_rate()))
        if self.epoch_table and self.verbose:
            table = router_table(logs or {}, legend=not self._legend_shown)
            if table:
                self._legend_shown = True
                print(table, flush=True)

    def on_test_batch_end(self, batch, logs=None):
        super().on_test_batch_end(batch, short_logs(logs))

    def on_test_end(self, logs=None):
        super().on_test_end(short_logs(logs))


def with_compact_progbar(callbacks: Any) -> list:
    """`callbacks` as a list, with a `CompactProgbar` added unless a progress bar is there
    (a `keras.callbacks.CallbackList`, already complete, is returned as it is)."""
    if isinstance(callbacks, keras.callbacks.CallbackList):
        return callbacks
    callbacks = list(callbacks or [])
    if not any(isinstance(c, keras.callbacks.ProgbarLogger) for c in callbacks):
        callbacks.append(CompactProgbar())
    return callbacks


def _is_tf_dataset(value: Any) -> bool:
    return type(value).__module__.startswith("tensorflow") and hasattr(value, "element_spec")


class CompactFitMixin(ModelMixinBase):
    """`keras.Model` mixin: `fit` and `evaluate` print `CompactProgbar`'s short lines.

    `fit` also reads a `tf.data.Dataset` in its own order (`shuffle=False` unless
    given: Keras cannot shuffle a dataset and warns that it will not), and without
    `steps_per_epoch` an epoch that ends with the data is not reported as data
    that "ran out" (Keras warns so whenever it did not know the dataset's length).
    """

    def fit(self, *args: Any, **kwargs: Any) -> Any:
        if len(args) <= 5:  # `callbacks` is fit's sixth argument
            kwargs["callbacks"] = with_compact_progbar(kwargs.get("callbacks"))
        if (
            len(args) <= 8
            and "shuffle" not in kwargs
            and _is_tf_dataset(args[0] if args else kwargs.get("x"))
        ):
            kwargs["shuffle"] = False
        with warnings.catch_warnings():
            if kwargs.get("steps_per_epoch") is None and len(args) <= 12:
                warnings.filterwarnings("ignore", message="Your input ran out of data")
            return super().fit(*args, **kwargs)

    def evaluate(self, *args: Any, **kwargs: Any) -> Any:
        if len(args) <= 6:  # `callbacks` is evaluate's seventh argument
            kwargs["callbacks"] = with_compact_progbar(kwargs.get("callbacks"))
        with warnings.catch_warnings():
            if kwargs.get("steps") is None and len(args) <= 5:
                warnings.filterwarnings("ignore", message="Your input ran out of data")
            return super().evaluate(*args, **kwargs)
