"""Working on an existing quality.py result: `--retime` re-times its models,
`--reuse` keeps its runs."""

import time

from benchmarks.quality_stats import compare


def retime(output, step_times, main_configs, table1_configs):
    """Adds `step_times` to the result `output` and recomputes its comparison
    and Table 1 ratios from them; returns the updated payload."""
    from benchmarks import common

    payload = common.read_result(output)
    if payload is None:
        raise SystemExit(f"--retime: no result {common.result_path(output)} to retime")
    runs = payload["runs"]
    dense = step_times["dense"]["median"]
    for name in main_configs:
        if name in runs:
            payload["comparison"][name] = compare(
                runs[name], runs["dense"], step_times[name]["median"] / dense
            )
    for row in payload.get("table1", []):
        if row["name"] in table1_configs:
            row["step_time_vs_dense_interleaved"] = step_times[row["name"]]["median"] / dense
    for name, row in payload.get("dropless_vs_capacity", {}).items():
        row["step_time_ratio"] = (
            step_times[name]["median"] / step_times[name.replace("_dropless", "")]["median"]
        )
        row["step_time_ratio_interleaved"] = True
    payload["interleaved_step_times"] = step_times
    payload["retimed"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    common.write_result(output, payload)
    for name, c in payload["comparison"].items():
        print(
            f"{name}: step time x{c['step_time_vs_dense_interleaved']:.3f} of dense "
            "(interleaved); "
            + (
                "never reaches the dense final value"
                if c["fraction_of_dense_time"] is None
                else f"{100 * c['fraction_of_dense_time']:.0f}% of the dense "
                "training time to its final value"
            ),
            flush=True,
        )
    return payload


# Arguments that only choose which models run or where results go; every other
# argument changes what a model's training measures.
SELECTION_ARGS = frozenset(
    {
        "experts",
        "dropless_experts",
        "no_main",
        "table1",
        "table1_experts",
        "table1_cf",
        "timing_repeats",
        "retime",
        "reuse",
        "output",
        "no_plot",
        "smoke",
        "export_batches",
        "batches",
        "workers",
        "job",
        "job_output",
    }
)


def reusable_runs(output, args):
    """The runs of the existing result `output`, checked to have been trained with
    the same training arguments as `args` ({} if there is no such result)."""
    from benchmarks import common

    payload = common.read_result(output)
    if payload is None:
        return {}
    path = common.result_path(output)
    stored = payload.get("args", {})
    differing = sorted(
        k for k, v in vars(args).items() if k not in SELECTION_ARGS and stored.get(k) != v
    )
    if differing:
        raise SystemExit(
            f"--reuse: {path} was trained with different arguments: "
            + ", ".join(
                f"--{k} {stored.get(k)!r} there, {getattr(args, k)!r} now" for k in differing
            )
        )
    return payload["runs"]
