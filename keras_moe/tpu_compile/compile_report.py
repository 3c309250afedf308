"""The readable summary `keras-moe-compile` prints of a compile-only report.

`format_report` turns `keras_moe.tpu_compile.compile_only.compile_train_step`'s
dict into lines: per-chip bytes, the fit, FLOPs, collectives, the MoE
exchange, matmul precisions, the roofline bound, and, when the step does not
fit, its biggest buffers and what to change (`compile_memory`).
"""

from keras_moe.parallel.token_exchange import format_exchange_choices
from keras_moe.tpu_compile import compile_memory, roofline

GIB = 2**30


def format_report(report):
    """A readable multi-line summary of `compile_train_step`'s report."""

    def gib(value):
        if value is None:
            return "n/a"
        if value < 0.1 * GIB:
            return f"{value / GIB:.3f} GiB ({value / 2**20:.1f} MiB)"
        return f"{value / GIB:.3f} GiB"

    where = (
        f"TPU {report['topology']} ({report['chips']} chips, {report['device_kind']})"
        if report["topology"]
        else f"{report['chips']} emulated CPU devices"
    )
    batch = report["batch"]
    lines = [
        f"train step of {' + '.join(report['gin_files'])} on {where}",
        f"  mesh {report['mesh']}, batch {batch['batch_size']} x "
        f"({batch.get('inputs')} + {batch.get('targets')}) tokens, dispatch "
        f"{report['dispatch']}, {report['parameters'] / 1e6:.1f}M parameters "
        f"({report['param_dtype']}), dtype policy {report['dtype_policy']} (compute "
        f"{report['compute_dtype']})",
        "  per chip:",
        f"    parameters    {gib(report['param_bytes'])}   (shard shapes)",
        f"    optimizer     {gib(report['optimizer_bytes'])}   (shard shapes)",
        f"    arguments     {gib(report['argument_bytes'])}   (compiler)",
        f"    outputs       {gib(report['output_bytes'])}   (aliased to donated arguments: "
        f"{gib(report['alias_bytes'])})",
        f"    temporaries   {gib(report['temp_bytes'])}",
        f"    peak          {gib(report['peak_bytes'])}   ({report['peak_source']})",
    ]
    if report["hbm_bytes"] is not None:
        lines.append(f"    HBM           {gib(report['hbm_bytes'])}   ({report['generation']})")
    if report["fits"] is None:
        lines.append("  fits: unknown (no TPU topology)")
    elif report["fits"]:
        lines.append("  fits: yes")
    else:
        lines.append(f"  fits: NO - {report['error'] or 'peak exceeds HBM'}")
        lines.extend(compile_memory.format_memory_advice(report))
    if report["flops_per_chip"] is not None:
        lines.append(
            f"  FLOPs per step per chip: {report['flops_per_chip']:.4g} "
            f"(x {report['chips']} chips = "
            f"{report['flops_per_chip'] * report['chips']:.4g})"
        )
    if report["collectives"] is not None:
        lines.append(
            "  collectives: "
            + ", ".join(f"{k.replace('_', '-')} {v}" for k, v in report["collectives"].items())
        )
    gathers = report.get("activation_all_gathers")
    if gathers and gathers["count"]:
        largest = ", ".join(
            f"{g['dims']} ({g['op_name'] or 'no op name'})" for g in gathers["largest"]
        )
        lines.append(
            f"  activation all-gathers: {gathers['count']} (not shaped like a weight; "
            f"{gib(gathers['received_bytes'])} received per chip), largest: {largest}"
        )
    if report.get("moe_exchange"):
        lines.append("  MoE expert exchange, per layer:")
        lines.extend(f"    {line}" for line in format_exchange_choices(report["moe_exchange"]))
    if report["matmul_dtypes"]:
        lines.append(
            "  matmuls by result type, as lowered: "
            + ", ".join(f"{k} {v}" for k, v in report["matmul_dtypes"].items())
        )
    if report.get("generation"):
        lines.extend(roofline.format_estimate(report.get("roofline")))
    lines.append(f"  compiled in {report['compile_seconds']} s")
    return "\n".join(lines)
