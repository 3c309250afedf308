"""Draws docs/sharding_mesh.png: the (data=2, expert=4) mesh, where the MoE
tensors live, and where the all-to-all happens. Run: python docs/make_sharding_figure.py
"""

import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.patches import FancyArrowPatch, Rectangle

DATA, EXPERT = 2, 4
COLORS = ["#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#b07aa1", "#76b7b2", "#edc948", "#ff9da7"]

fig, axes = plt.subplots(1, 3, figsize=(15, 5.2))


def mesh_panel(ax, title, label_fn, color_fn):
    ax.set_title(title, fontsize=11)
    for d in range(DATA):
        for e in range(EXPERT):
            dev = d * EXPERT + e
            ax.add_patch(Rectangle((e, DATA - 1 - d), 0.92, 0.92, color=color_fn(d, e), alpha=0.85))
            ax.text(
                e + 0.46,
                DATA - 1 - d + 0.62,
                f"device {dev}",
                ha="center",
                fontsize=8,
                color="white",
                weight="bold",
            )
            ax.text(
                e + 0.46,
                DATA - 1 - d + 0.28,
                label_fn(d, e),
                ha="center",
                fontsize=8,
                color="white",
            )
    ax.set_xlim(-0.1, EXPERT)
    ax.set_ylim(-0.45, DATA + 0.1)
    ax.set_xticks([i + 0.46 for i in range(EXPERT)], [f"expert={i}" for i in range(EXPERT)])
    ax.set_yticks([DATA - 1 - i + 0.46 for i in range(DATA)], [f"data={i}" for i in range(DATA)])
    ax.set_aspect("equal")
    for side in ("top", "right", "left", "bottom"):
        ax.spines[side].set_visible(False)


mesh_panel(
    axes[0],
    "tokens x [G, S, d]: G over (data, expert)\nrouter, attention, dense layers",
    lambda d, e: f"groups {2 * (d * EXPERT + e)}-{2 * (d * EXPERT + e) + 1}",
    lambda d, e: COLORS[d * EXPERT + e],
)
mesh_panel(
    axes[2],
    "expert buffers [E, G, C, d]: E over expert,\nG over data; weights wi/wo [E, d, f]",
    lambda d, e: f"E {2 * e}-{2 * e + 1}, G half {d}",
    lambda d, e: COLORS[e * 2],
)
ax = axes[1]
ax.axis("off")
ax.set_xlim(0, 1)
ax.set_ylim(0, 1)
ax.add_patch(
    FancyArrowPatch(
        (0.05, 0.68), (0.95, 0.68), arrowstyle="-|>", mutation_scale=25, color="black", lw=2
    )
)
ax.add_patch(
    FancyArrowPatch(
        (0.95, 0.36), (0.05, 0.36), arrowstyle="-|>", mutation_scale=25, color="black", lw=2
    )
)
ax.text(
    0.5,
    0.78,
    "dispatch: all-to-all over the expert axis\n(within each data row)",
    ha="center",
    fontsize=10,
)
ax.text(0.5, 0.2, "combine: all-to-all back", ha="center", fontsize=10)
ax.text(
    0.5,
    0.5,
    'with_logical_constraint(\n  ("expert", "batch", None, "embed"))',
    ha="center",
    fontsize=9,
    family="monospace",
)
ax.text(
    0.5,
    0.02,
    "rules: expert->expert, batch->(data, expert) | data,\nmlp/heads/vocab->model",
    ha="center",
    fontsize=8,
    color="#444",
)
fig.suptitle("keras_moe on a (data=2, expert=4) mesh, 8 experts: GShard layout", fontsize=13)
fig.tight_layout()
out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "sharding_mesh.png")
fig.savefig(out, dpi=110)
print(out)
