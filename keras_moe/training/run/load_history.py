"""Expert load over training: the measurements of every `expert_load_every` step,
kept in `expert_load_history.json` and drawn in `expert_load_history.png`.

Each entry of the history is one measurement on the held batch:
`{"step": int, "load": {layer path: [E shares]}, "dropped_fraction": {layer path: float},
"train_dropped_fraction": {layer path: float}}` (the last one is the training
trackers' running mean at that step; absent where the model has none).
"""

import json
import os

import numpy as np

from keras_moe.training import checkpoint as ckpt_lib
from keras_moe.training.run import expert_load

JSON_NAME = "expert_load_history.json"
PNG_NAME = "expert_load_history.png"


def read_history(model_dir, up_to_step=None):
    """The history saved in `model_dir` (a list of entries, oldest first).

    Args:
        model_dir: the run's folder.
        up_to_step: keep only the entries of steps <= this (a run resumed from
            a checkpoint at that step measures the later steps again).

    Returns:
        the entries; `[]` when there is no history file yet.
    """
    path = os.path.join(model_dir, JSON_NAME)
    if not os.path.isfile(path):
        return []
    with open(path, encoding="utf-8") as f:
        entries = json.load(f)
    if not isinstance(entries, list):
        raise ValueError(
            f"{path}: expected a JSON list of measurements, got {type(entries).__name__}"
        )
    return [e for e in entries if up_to_step is None or int(e["step"]) <= up_to_step]


def write_history(model_dir, entries):
    """Writes `entries` to `expert_load_history.json` and draws `expert_load_history.png`
    in `model_dir` (each file atomically); returns the PNG's path."""
    ckpt_lib.atomic_write_text(os.path.join(model_dir, JSON_NAME), json.dumps(entries, indent=1))
    path = os.path.join(model_dir, PNG_NAME)
    plot_history(entries, path)
    return path


def history_matrix(entries, layer):
    """One layer's history as arrays for the heat map.

    Args:
        entries: history entries (see the module docstring), in step order.
        layer: the MoE layer's path.

    Returns:
        `(steps [S], load [E, S], dropped [S])`: the measurement steps, each
        expert's share of the selected choices at each step (a column per step),
        and the held batch's dropped fraction at each step (NaN where not measured).
        Steps where the layer was not measured are left out.

    Example:
    >>> entries = [{"step": 10, "load": {"enc": [0.75, 0.25]}, "dropped_fraction": {"enc": 0.5}},
    ...            {"step": 20, "load": {"enc": [0.5, 0.5]}, "dropped_fraction": {"enc": 0.0}}]
    >>> steps, load, dropped = history_matrix(entries, "enc")
    >>> steps.tolist(), load.tolist(), dropped.tolist()
    ([10, 20], [[0.75, 0.5], [0.25, 0.5]], [0.5, 0.0])
    """
    rows = [e for e in entries if layer in e.get("load", {})]
    steps = np.array([int(e["step"]) for e in rows], np.int64)
    if not rows:
        return steps, np.zeros((0, 0)), np.zeros((0,))
    load = np.array([e["load"][layer] for e in rows], np.float64).T
    dropped = np.array([e.get("dropped_fraction", {}).get(layer, np.nan) for e in rows], np.float64)
    return steps, load, dropped


def cell_edges(steps):
    """The heat map's cell edges: each cell centred on its measurement step (edges half
    way between measurements), the outer ones cut at step 0 and at the last step, so
    the axis covers the steps the run took and no more.

    Example:
    >>> cell_edges(np.array([0, 100, 200, 300])).tolist()
    [0.0, 50.0, 150.0, 250.0, 300.0]
    >>> cell_edges(np.array([100, 200])).tolist()
    [50.0, 150.0, 200.0]
    """
    steps = np.asarray(steps, np.float64)
    if len(steps) == 1:
        return np.array([steps[0] - 0.5, steps[0] + 0.5])
    mids = (steps[1:] + steps[:-1]) / 2.0
    first = max(steps[0] - (mids[0] - steps[0]), min(0.0, steps[0]))
    return np.concatenate([[first], mids, [steps[-1]]])


def layers_of(entries):
    """The layer paths of the history, in the order they first appear."""
    names = []
    for entry in entries:
        for name in entry.get("load", {}):
            if name not in names:
                names.append(name)
    return names


def plot_history(entries, path, title="Expert load over training (held batch)"):
    """Draws, per MoE layer, a heat map of the load (experts x measurement steps,
    colour = share of the selected choices) with the dropped fraction over the
    steps beneath it, to the PNG `path` (atomically)."""
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    names = layers_of(entries)
    n = max(len(names), 1)
    fig, axes = plt.subplots(
        2 * n,
        1,
        figsize=(8, 3.6 * n),
        squeeze=False,
        gridspec_kw={"height_ratios": [3, 1] * n},
        layout="constrained",
    )
    for i, name in enumerate(names):
        heat_ax, drop_ax = axes[2 * i, 0], axes[2 * i + 1, 0]
        steps, load, dropped = history_matrix(entries, name)
        edges = cell_edges(steps)
        mesh = heat_ax.pcolormesh(
            edges,
            np.arange(load.shape[0] + 1) - 0.5,
            load,
            cmap="viridis",
            vmin=0.0,
            shading="flat",
        )
        # One colour bar beside both panels keeps their step axes aligned.
        fig.colorbar(mesh, ax=[heat_ax, drop_ax], label="share of choices", pad=0.01)
        heat_ax.set_title(f"{name}  (uniform share {1.0 / load.shape[0]:.3f})", fontsize=9)
        heat_ax.set_ylabel("expert")
        if load.shape[0] <= 16:
            heat_ax.set_yticks(np.arange(load.shape[0]))
        heat_ax.set_xlim(edges[0], edges[-1])
        drop_ax.plot(steps, dropped, marker="o", markersize=3, label="held batch (eval)")
        train = [
            e.get("train_dropped_fraction", {}).get(name, np.nan)
            for e in entries
            if name in e.get("load", {})
        ]
        if not np.all(np.isnan(np.asarray(train, np.float64))):
            drop_ax.plot(steps, train, marker=".", linestyle="--", label="training (epoch mean)")
        drop_ax.set_xlim(edges[0], edges[-1])
        drop_ax.set_ylim(bottom=0.0)
        drop_ax.set_ylabel("dropped")
        drop_ax.legend(loc="upper right", fontsize=7)
    if not names:
        axes[0, 0].text(0.5, 0.5, "no expert-load measurements", ha="center", va="center")
    axes[-1, 0].set_xlabel("step")
    fig.suptitle(title)
    expert_load.save_figure(fig, path)
    return path
