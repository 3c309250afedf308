"""quality.py's comparison of runs: seed means and spread, gains over dense, steps to reach."""

import statistics


def steps_to_reach(curve, target):
    """First step at which `curve` (list of (step, value), higher is better)
    reaches `target`, interpolating linearly between eval points; None if never.

    >>> steps_to_reach([(0, -9.0), (100, -5.0), (200, -3.0)], -4.0)
    150.0
    """
    previous = None
    for step, value in curve:
        if value >= target:
            if previous is None or previous[1] >= target:
                return float(step)
            (s0, v0), (s1, v1) = previous, (step, value)
            return float(s0 + (target - v0) * (s1 - s0) / (v1 - v0))
        previous = (step, value)
    return None


def mean_over_seeds(outs, seeds):
    """One run's record from the `train_with_curve` records of several seeds:
    the mean curve, the mean final value with its per-seed values and standard
    deviation, and the median step time; per-seed curves under `per_seed`."""
    curve = []
    for points in zip(*(o["curve"] for o in outs), strict=False):
        curve.append(
            {
                "step": points[0]["step"],
                **{
                    key: statistics.fmean(p[key] for p in points)
                    for key in ("seconds", "neg_log_perplexity", "accuracy", "loss")
                },
            }
        )
    finals = [o["final_neg_log_perplexity"] for o in outs]
    return {
        "curve": curve,
        "final_neg_log_perplexity": curve[-1]["neg_log_perplexity"],
        "final_accuracy": curve[-1]["accuracy"],
        "seeds": list(seeds),
        "final_per_seed": finals,
        "final_std": statistics.stdev(finals) if len(finals) > 1 else None,
        "step_time_s": statistics.median(o["step_time_s"] for o in outs),
        "train_seconds": sum(o["train_seconds"] for o in outs),
        "per_seed": outs,
    }


def gain_in_seed_std(moe_run, dense_run):
    """The final gain over dense in units of the dense model's seed-to-seed std
    (None with a single seed)."""
    std = dense_run["final_std"]
    gain = moe_run["final_neg_log_perplexity"] - dense_run["final_neg_log_perplexity"]
    return gain / std if std else None


TARGETS = {
    "gain": "each Switch model's final held-out neg log perplexity exceeds dense by >= 0.05 "
    "nats and by >= 5 dense seed std",
    "half_steps": "each Switch model reaches the dense model's final value in <= 1/2 of the "
    "dense model's steps",
    "half_wall_clock": "... and in <= 1/2 of the dense model's training wall time",
    "ordering": "more experts is better: Switch-16 >= Switch-8 >= dense",
}


def difference_with_noise(better, worse):
    """`better` minus `worse` (final neg log perplexity, seed means) with the
    std of that difference (from each run's seed std) and whether it exceeds
    twice that std; `resolved` is None with a single seed."""
    diff = better["final_neg_log_perplexity"] - worse["final_neg_log_perplexity"]
    n = len(better["final_per_seed"])
    if better["final_std"] is None or worse["final_std"] is None:
        return {"difference": diff, "noise_std": None, "resolved": None}
    noise = ((better["final_std"] ** 2 + worse["final_std"] ** 2) / n) ** 0.5
    return {"difference": diff, "noise_std": noise, "resolved": diff > 2 * noise}


def compare(moe_run, dense_run, step_time_ratio=None):
    """How a sparse run does against the dense one, in steps, wall time and final value.

    The wall-time target is judged on `step_time_ratio` (sparse over dense step
    time, timed interleaved in one stretch, so machine load hits both alike)
    times the fraction of steps, when given; else on the runs' own clocks.

    >>> dense = {"curve": [{"step": 0, "seconds": 0.0, "neg_log_perplexity": -9.0},
    ...                    {"step": 100, "seconds": 50.0, "neg_log_perplexity": -4.0}],
    ...          "final_neg_log_perplexity": -4.0, "final_std": 0.01, "step_time_s": 0.5}
    >>> moe = {"curve": [{"step": 0, "seconds": 0.0, "neg_log_perplexity": -9.0},
    ...                  {"step": 50, "seconds": 30.0, "neg_log_perplexity": -4.0},
    ...                  {"step": 100, "seconds": 60.0, "neg_log_perplexity": -3.5}],
    ...        "final_neg_log_perplexity": -3.5, "step_time_s": 0.6}
    >>> c = compare(moe, dense)
    >>> c["fraction_of_dense_steps"], c["fraction_of_dense_seconds"], c["meets"]
    (0.5, 0.6, {'gain': True, 'half_steps': True, 'half_wall_clock': False})
    """
    dense_final = dense_run["final_neg_log_perplexity"]
    dense_steps = dense_run["curve"][-1]["step"]
    dense_seconds = dense_run["curve"][-1]["seconds"]
    reach = steps_to_reach(
        [(p["step"], p["neg_log_perplexity"]) for p in moe_run["curve"]], dense_final
    )
    reach_s = steps_to_reach(
        [(p["seconds"], p["neg_log_perplexity"]) for p in moe_run["curve"]], dense_final
    )
    gain = moe_run["final_neg_log_perplexity"] - dense_final
    in_std = gain_in_seed_std(moe_run, dense_run)
    time_fraction = None if reach_s is None else reach_s / dense_seconds
    if step_time_ratio is not None:
        time_fraction = None if reach is None else reach / dense_steps * step_time_ratio
    return {
        "steps_to_dense_final": reach,
        "fraction_of_dense_steps": None if reach is None else reach / dense_steps,
        "seconds_to_dense_final": reach_s,
        "fraction_of_dense_seconds": None if reach_s is None else reach_s / dense_seconds,
        "final_gain_over_dense": gain,
        "gain_in_dense_seed_std": in_std,
        "step_time_vs_dense": moe_run["step_time_s"] / dense_run["step_time_s"],
        "step_time_vs_dense_interleaved": step_time_ratio,
        "fraction_of_dense_time": time_fraction,
        "meets": {
            "gain": gain >= 0.05 and in_std is not None and in_std >= 5,
            "half_steps": reach is not None and reach <= 0.5 * dense_steps,
            "half_wall_clock": time_fraction is not None and time_fraction <= 0.5,
        },
    }
