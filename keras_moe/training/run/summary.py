"""A run's closing summary: the dict written to summary.json and its console text."""

from __future__ import annotations

import math


class TrainSummary(dict):
    """`train`'s summary (a dict, as written to summary.json) with the trained model as `.model`.

    Example:
    >>> summary = TrainSummary({"start_step": 0, "end_step": 300})
    >>> summary["end_step"], summary.model is None
    (300, True)
    """

    model = None


def format_summary(summary: dict) -> str:
    """Human-readable end-of-run summary."""
    lines = ["", "=" * 72, "keras_moe training summary", "=" * 72]
    lines.append(
        f"task            {summary['task']}  (strategy {summary['strategy']}, "
        f"{summary['replicas']} replica(s))"
    )
    resumed = f"  (resumed from {summary['resumed_from']})" if summary["resumed_from"] else ""
    if summary.get("mesh"):
        lines.append(f"device mesh     {summary['mesh']}")
        for name, full, local in summary["shards"]:
            lines.append(f"  {name}: {tuple(full)} -> {tuple(local)} on one device")
    lines.append(f"steps           {summary['start_step']} -> {summary['end_step']}{resumed}")
    if summary["first_step_loss"] is not None:
        lines.append(
            f"train loss      first step {summary['first_step_loss']:.4f}, "
            f"last epoch mean {summary['last_epoch_loss']:.4f}"
        )
    elif summary["last_epoch_loss"] is not None:
        lines.append(f"train loss      last epoch mean {summary['last_epoch_loss']:.4f}")
    if summary["eval_end"]:
        start = summary["eval_start"]
        before = f"{start['loss']:.4f} -> " if start else ""
        lines.append(
            f"{summary['eval_split']} loss{' ' * max(1, 6 - len(summary['eval_split']))}"
            f"{before}{summary['eval_end']['loss']:.4f} "
            f"(accuracy {summary['eval_end'].get('accuracy', math.nan):.3f})"
        )
    lines.append(
        f"time            {summary['train_seconds']:.0f} s training, "
        f"{summary['wall_seconds']:.0f} s in total"
    )
    lines.append(f"checkpoint      {summary['checkpoint']}")
    lines.append(f"tensorboard     tensorboard --logdir {summary['tensorboard']}")
    lines.append(f"expert load     {summary['expert_load_plot']}")
    if summary.get("expert_load_history"):
        lines.append(f"load history    {summary['expert_load_history']}")
    lines.append(f"gin config      {summary['operative_config']}")
    lines.append("=" * 72)
    return "\n".join(lines)
