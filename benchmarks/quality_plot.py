"""quality.py's figure: held-out neg. log perplexity per step, one line per model."""


def plot(runs, dense_name, path, title):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for name, run in runs.items():
        steps = [p["step"] for p in run["curve"]][1:]  # step 0 squashes the scale
        values = [p["neg_log_perplexity"] for p in run["curve"]][1:]
        (line,) = ax.plot(
            steps,
            values,
            marker="o",
            markersize=3,
            label=name,
            color="black" if name == dense_name else None,
        )
        if len(run.get("per_seed", [])) > 1:  # min-max band over the seeds
            per_seed = [[p["neg_log_perplexity"] for p in o["curve"]][1:] for o in run["per_seed"]]
            ax.fill_between(
                steps,
                [min(v) for v in zip(*per_seed, strict=False)],
                [max(v) for v in zip(*per_seed, strict=False)],
                color=line.get_color(),
                alpha=0.15,
            )
    if dense_name in runs:
        ax.axhline(
            runs[dense_name]["final_neg_log_perplexity"],
            color="gray",
            ls=":",
            lw=1,
            label="dense final",
        )
    ax.set_xlabel("training step")
    ax.set_ylabel("held-out neg. log perplexity")
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
