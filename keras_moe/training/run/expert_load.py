"""Per-MoE-layer expert load: measured with a short eval pass, plotted with matplotlib."""

import io
import json
import os

import numpy as np

from keras_moe import compat
from keras_moe.layers.moe import MoeLayer
from keras_moe.training.checkpoint import atomic_write_bytes
from keras_moe.training.checkpoint.atomic_files import atomic_write_text


def moe_layers(model):
    """`{path: MoeLayer}` of every MoE layer of `model`, in model order."""

    out = {}
    for layer in compat.sublayers(model):
        if isinstance(layer, MoeLayer):
            out[layer.path or layer.name] = layer
    return out


def measure_expert_load(model, batches):
    """Mean expert load fraction `[E]` per MoE layer over `batches` (eval mode).

    Each MoE layer is run with `return_metrics=True` for the pass (its call is
    wrapped and restored afterwards), so the numbers are the layer's own
    `selection_load` statistics: each expert's share of every selected choice
    (all k of a token), before capacity.

    Args:
        model: a built `EncoderDecoder` (or any model with MoE layers).
        batches: iterable of Keras `(x, y, sample_weight)` or `x` batches.

    Returns:
        `{layer path: np.ndarray [E]}` (each row sums to 1 when tokens were routed).
    """
    return {path: m["load"] for path, m in measure_router_pass(model, batches).items()}


def measure_router_pass(model, batches):
    """Expert load and dropped fraction per MoE layer over `batches` (eval mode).

    Args:
        model: a built `EncoderDecoder` (or any model with MoE layers).
        batches: iterable of Keras `(x, y, sample_weight)` or `x` batches.

    Returns:
        `{layer path: {"load": np.ndarray [E], "dropped_fraction": float}}`: the
        load as in `measure_expert_load`; the dropped fraction is the layer's
        `dropped_fraction` statistic averaged over the batches' real tokens.
    """
    layers = moe_layers(model)
    sums = {path: None for path in layers}
    drops = {path: [0.0, 0.0] for path in layers}  # [dropped tokens, tokens]
    saved = {}
    for path, layer in layers.items():
        original = layer.call
        saved[path] = layer.__dict__.get("call")

        def call(inputs, mask=None, training=None, _orig=original, _path=path, **kwargs):
            outputs, stats = _orig(
                inputs, mask=mask, training=training, return_metrics=True, **kwargs
            )
            load = np.asarray(stats["selection_load"], np.float64)
            sums[_path] = load if sums[_path] is None else sums[_path] + load
            tokens = float(np.asarray(stats["num_tokens"]))
            drops[_path][0] += float(np.asarray(stats["dropped_fraction"])) * tokens
            drops[_path][1] += tokens
            return outputs

        layer.call = call
    try:
        for batch in batches:
            x = batch[0] if isinstance(batch, (tuple, list)) else batch
            model(x, training=False)
    finally:
        for path, layer in layers.items():
            if saved[path] is None:
                layer.__dict__.pop("call", None)
            else:
                layer.__dict__["call"] = saved[path]
    out = {}
    for path, total in sums.items():
        if total is not None:
            dropped, tokens = drops[path]
            out[path] = {
                "load": total / max(total.sum(), 1e-12),
                "dropped_fraction": dropped / tokens if tokens else 0.0,
            }
    return out


def max_violation(load):
    """MaxVio of a load `[E]`: the largest load over the mean load, minus 1.

    Example:
    >>> round(max_violation([0.5, 0.25, 0.25, 0.0]), 6)
    1.0
    """
    load = np.asarray(load, np.float64)
    mean = float(load.mean())
    return float(load.max()) / mean - 1.0 if mean > 0 else 0.0


def plot_expert_load(loads, path, title="Expert load per MoE layer"):
    """Writes a bar chart per MoE layer (share of the selected choices per expert,
    with its MaxVio) to `path` (atomically)."""
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    names = list(loads)
    n = max(len(names), 1)
    fig, axes = plt.subplots(n, 1, figsize=(7, 2.2 * n), squeeze=False)
    for ax, name in zip(axes[:, 0], names, strict=False):
        load = np.asarray(loads[name])
        experts = np.arange(len(load))
        ax.bar(experts, load, color="tab:blue")
        ax.axhline(1.0 / len(load), color="tab:red", linestyle="--", linewidth=1, label="uniform")
        ax.set_title(f"{name}  (MaxVio {max_violation(load):.2f})", fontsize=9)
        ax.set_ylabel("fraction")
        # Every expert up to 16; beyond, every k-th (32 labels overlap at this width).
        ax.set_xticks(experts[:: max(1, -(-len(load) // 16))])
        ax.set_ylim(0, max(float(load.max()) * 1.15, 2.0 / len(load)))
    if not names:
        axes[0, 0].text(0.5, 0.5, "no MoE layers", ha="center", va="center")
    axes[-1, 0].set_xlabel("expert")
    axes[0, 0].legend(loc="upper right", fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    save_figure(fig, path)
    return path


def save_figure(fig, path):
    """Writes the matplotlib figure `fig` to the PNG `path` atomically and closes it."""

    import matplotlib.pyplot as plt

    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=100)
    plt.close(fig)
    atomic_write_bytes(path, buffer.getvalue())


def write_expert_load(model, data, split, model_dir, step):
    """Writes `expert_load.png` / `.json` of the tokens of `data` into `model_dir`.

    Args:
        model: the trained model.
        data: a finite dataset of Keras batches.
        split: the split `data` came from (the plot's title).
        model_dir: the run's folder.
        step: the optimizer step (the plot's title).

    Returns:
        the plot's path, or None when the model has no experts.
    """

    loads = measure_expert_load(model, data)
    if not loads:
        return None
    path = os.path.join(model_dir, "expert_load.png")
    plot_expert_load(loads, path, title=f"Expert load at step {step} ({split})")
    atomic_write_text(
        os.path.join(model_dir, "expert_load.json"),
        json.dumps({k: [float(x) for x in v] for k, v in loads.items()}, indent=1),
    )
    return path
