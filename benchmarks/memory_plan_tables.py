"""memory_plan.py's reading of its rows: per-device totals, fit on a chip, markdown tables."""

# HBM per chip (GiB) of the slices the CPU-device table is checked against.
CHIPS = {"TPU v4": 32, "TPU v5e": 16}


def per_device_total(row):
    """Parameters + optimizer state + temporaries (the donated state is reused for outputs)."""
    return row["param_bytes"] + row["optimizer_bytes"] + (row["temp_bytes"] or 0)


def fits(row):
    """{chip: fits in its HBM with 10 % left for the runtime} (CPU-device rows)."""
    total = per_device_total(row)
    return {chip: total <= 0.9 * gib * 2**30 for chip, gib in CHIPS.items()}


def markdown_table(rows):
    """The plan as the table in docs/sharding.md (CPU-device rows)."""
    gib = 2**30
    lines = [
        "| model | devices | mesh (data × expert) | parameters | optimizer | temporaries | "
        "total | all-to-all | fits "
        + " / ".join(f"{c} ({g} GiB)" for c, g in CHIPS.items())
        + " |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        fit = " / ".join("yes" if ok else "no" for ok in fits(row).values())
        mesh = row["mesh"]
        lines.append(
            f"| {row['model']} ({row['parameters'] / 1e9:.1f}B) | {row['devices']} | "
            f"{mesh['data']} × {mesh['expert']} | {row['param_bytes'] / gib:.2f} GiB | "
            f"{row['optimizer_bytes'] / gib:.2f} GiB | {row['temp_bytes'] / gib:.2f} GiB | "
            f"{per_device_total(row) / gib:.2f} GiB | {row['all_to_all']} | {fit} |"
        )
    return "\n".join(lines)


def tpu_markdown_table(rows):
    """The TPU-compiler plan (--topology rows): the compiler's own sizes and verdict."""
    gib = 2**30

    def size(value):
        return "—" if value is None else f"{value / gib:.2f} GiB"

    lines = [
        "| model | topology (chips) | mesh (data × expert) | parameters | optimizer | "
        "temporaries | peak | HBM | fits | all-to-all | TFLOP per chip per step |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        mesh = row["mesh"]
        fit = "yes" if row["compiler_fits"] else "no"
        if row["error"]:
            # "... required for HLO temporaries (X) exceeds available HBM (Y)"
            fit = "no (RESOURCE_EXHAUSTED)"
        flops = "—" if row["flops_per_chip"] is None else f"{row['flops_per_chip'] / 1e12:.1f}"
        lines.append(
            f"| {row['model']} ({row['parameters'] / 1e9:.1f}B) | {row['topology']} "
            f"({row['devices']}) | {mesh['data']} × {mesh['expert']} | "
            f"{size(row['param_bytes'])} | {size(row['optimizer_bytes'])} | "
            f"{size(row['temp_bytes'])} | {size(row['peak_bytes'])} | "
            f"{size(row['hbm_bytes'])} | {fit} | "
            f"{'—' if row['all_to_all'] is None else row['all_to_all']} | {flops} |"
        )
    return "\n".join(lines)


def roofline_markdown_table(rows):
    """Each TPU row's roofline bound (keras_moe.tpu_compile.roofline) and the MFU it allows."""
    lines = [
        "| model | topology | TFLOP per chip (compiled / model) | HBM GB per chip | "
        "ICI MB sent per chip | compute / HBM / ICI ms | bound ms | MFU at bound |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        roof = row.get("roofline")
        if not roof:
            continue
        sent = sum((row.get("collective_bytes_per_chip") or {}).values())
        lines.append(
            f"| {row['model']} | {row['topology']} | {row['flops_per_chip'] / 1e12:.2f} / "
            f"{roof['model_flops_per_chip'] / 1e12:.2f} | "
            f"{(row['bytes_accessed_per_chip'] or 0) / 1e9:.1f} | {sent / 1e6:.1f} | "
            f"{roof['compute_seconds'] * 1e3:.1f} / {roof['memory_seconds'] * 1e3:.1f} / "
            f"{roof['ici_seconds'] * 1e3:.1f} | {roof['bound_seconds'] * 1e3:.1f} "
            f"({roof['bound_by']}) | {roof['mfu_at_bound']:.0%} |"
        )
    return "\n".join(lines)


def row_setting(row):
    """What a row was compiled for: model, topology, chips, batch size, dtype policy."""
    return (
        row["model"],
        row.get("topology"),
        row["devices"],
        row["batch"][0],
        row.get("dtype_policy") or "float32",
    )


def compare_table(tpu_rows, plan_rows, tolerance=0.15):
    """Markdown: each TPU row's peak beside the plan's total (`per_device_total`) of the
    CPU-device row with the same model, chip count, batch and dtype policy.

    Example:
    >>> tpu = [{"model": "m", "topology": "v4:2x2x2", "devices": 8, "batch": [16, 512, 114],
    ...         "dtype_policy": "mixed_bfloat16", "peak_bytes": 11 * 2 ** 30, "error": None}]
    >>> plan = [{"model": "m", "topology": None, "devices": 8, "batch": [16, 512, 114],
    ...          "dtype_policy": "mixed_bfloat16", "param_bytes": 4 * 2 ** 30,
    ...          "optimizer_bytes": 4 * 2 ** 30, "temp_bytes": 2 * 2 ** 30}]
    >>> print(compare_table(tpu, plan).splitlines()[-1])
    | m | v4:2x2x2 (8) | 16 | mixed_bfloat16 | 11.00 GiB | 10.00 GiB | +10.0 % | yes |
    """
    gib = 2**30
    plans = {
        (r["model"], r["devices"], r["batch"][0], r.get("dtype_policy") or "float32"): r
        for r in plan_rows
    }
    lines = [
        "| model | topology (chips) | batch | dtype policy | TPU peak | plan total "
        "(XLA:CPU) | TPU vs plan | within 15 % |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in tpu_rows:
        model, topology, chips, batch, policy = row_setting(row)
        plan = plans.get((model, chips, batch, policy))
        planned = per_device_total(plan) if plan else None
        peak = row.get("peak_bytes")
        if peak is None or planned is None:
            why = (
                "no plan row"
                if planned is None
                else "did not fit"
                if row.get("error")
                else "compile did not finish"
            )
            lines.append(
                f"| {model} | {topology} ({chips}) | {batch} | {policy} | — | "
                + ("—" if planned is None else f"{planned / gib:.2f} GiB")
                + f" | — | no ({why}) |"
            )
            continue
        ratio = peak / planned - 1
        lines.append(
            f"| {model} | {topology} ({chips}) | {batch} | {policy} | "
            f"{peak / gib:.2f} GiB | {planned / gib:.2f} GiB | {100 * ratio:+.1f} % | "
            f"{'yes' if abs(ratio) <= tolerance else 'no'} |"
        )
    return "\n".join(lines)
