"""What fills a chip's memory in a compiled train step, and which settings shrink it.

The TPU compiler's out-of-memory error only gives totals ("the total memory
required for HLO temporaries (16.70G) exceeds available HBM (15.75G)"). Its
buffer assignment, written when the compile is given `xla_dump_to`, is read
here: `*memory-usage-report.txt` lists the HBM ("default" memory space)
allocations, largest first, with the shapes of the values each one holds at
some point of the step. `memory_levers` names the settings that shrink them,
each with its gin binding or flag.
"""

import glob
import os
import re
from typing import Any

_SIZE_UNITS = {"B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40}
# "   16.00GiB( 82%);   16.00GiB;      5095424;     6; bf16[128,4,512,16], f32[...]"
_ROW = re.compile(
    r"^\s*[\d.]+\w+\(\s*\d+%\);\s*([\d.]+)(B|KiB|MiB|GiB|TiB);\s*\d+;\s*(\d+);"
    r"\s*(.*)$"
)


def parse_memory_usage_report(text: str, top: int = 5) -> list:
    """The `top` largest HBM allocations of a TPU memory-usage report.

    Args:
        text: a `*memory-usage-report.txt` of an XLA dump.
        top: how many allocations to keep.

    Returns:
        dicts {"bytes", "values", "shapes"}: the allocation's size, how many
        values share it over the step, and their shapes as the compiler
        wrote them (per chip).

    Example:
    >>> report = '''Memory Space: default (color=0)
    ... Total bytes: 17936020992 (16.70GiB)
    ...   cumulative_size;       size;       offset; used_by_n_values; shapes_list
    ...   ------------------------------------------------------------
    ...    16.00GiB( 82%);   16.00GiB;      5095424;   2; f32[128,4,512,512], f32[65536,10240]
    ...    16.50GiB( 84%);  512.00MiB;   2689449984;   1; f32[128,4,512,512]
    ...
    ... Memory Space: vmem (color=1)
    ...     2.00MiB(100%);    2.00MiB;            0;   1; f32[8,128]'''
    >>> [(a["bytes"] // 2 ** 20, a["shapes"]) for a in parse_memory_usage_report(report)]
    [(16384, 'f32[128,4,512,512], f32[65536,10240]'), (512, 'f32[128,4,512,512]')]
    """
    allocations: list[dict[str, Any]] = []
    space = None
    for line in text.splitlines():
        if line.startswith("Memory Space:"):
            space = line.split(":", 1)[1].strip().split(" ")[0]
            continue
        match = _ROW.match(line)
        if match and space == "default":
            size, unit, values, shapes = match.groups()
            allocations.append(
                {
                    "bytes": int(float(size) * _SIZE_UNITS[unit]),
                    "values": int(values),
                    "shapes": shapes.strip(),
                }
            )
    allocations.sort(key=lambda a: -a["bytes"])
    return allocations[:top]


def largest_allocations(dump_dir: str, top: int = 5):
    """`parse_memory_usage_report` of the train step's dump in `dump_dir`; None without one."""
    reports = sorted(glob.glob(os.path.join(dump_dir, "*train_step*memory-usage-report.txt")))
    if not reports:
        return None
    with open(reports[-1], encoding="utf-8", errors="replace") as f:
        return parse_memory_usage_report(f.read(), top) or None


def memory_levers(report: dict) -> list:
    """The settings that shrink a train step's per-chip memory, each with its binding.

    Args:
        report: `compile_train_step`'s report (uses batch, chips, topology,
            dtype_policy, group_size, sparse_ffn_classes).

    Example:
    >>> levers = memory_levers({"batch": {"batch_size": 256}, "chips": 16,
    ...     "topology": "v5e:4x4", "dtype_policy": "float32", "group_size": "sequence",
    ...     "sparse_ffn_classes": ["SwitchFeedForward"]})
    >>> print("\\n".join(levers))  # doctest: +ELLIPSIS
    batch: BATCH_SIZE = 128 (or --batch_size=128): temporaries scale with the sequences per chip
    routing groups: SwitchFeedForward.group_size (now 'sequence'): ...
    chips: a larger --topology (now v5e:4x4, 16 chips) with the mesh_shape's product equal to its chip count
    precision: train.dtype_policy = "mixed_bfloat16" (or --dtype_policy=mixed_bfloat16): ...
    rematerialisation: keras_moe has no option for it ...
    """  # noqa: E501 - verbatim output lines
    batch = int(report["batch"]["batch_size"])
    classes = report.get("sparse_ffn_classes") or ["<SparseFFN>"]
    group = " / ".join(f"{name}.group_size" for name in classes)
    lines = [
        f"batch: BATCH_SIZE = {max(1, batch // 2)} (or --batch_size={max(1, batch // 2)}): "
        "temporaries scale with the sequences per chip",
        f"routing groups: {group} (now {report.get('group_size')!r}): smaller groups "
        "shrink the dispatch/combine tensors [groups, tokens, experts, capacity], "
        'e.g. "sequence" or a token count',
        f"chips: a larger --topology (now {report.get('topology')}, {report['chips']} chips) "
        "with the mesh_shape's product equal to its chip count",
    ]
    if report.get("dtype_policy") != "mixed_bfloat16":
        lines.append(
            'precision: train.dtype_policy = "mixed_bfloat16" (or '
            "--dtype_policy=mixed_bfloat16): bfloat16 activations, half the bytes "
            "of float32"
        )
    lines.append(
        "rematerialisation: keras_moe has no option for it (no jax.checkpoint "
        "policy on its layers); the TPU compiler already recomputes some values "
        "on its own when memory is short"
    )
    return lines


def format_memory_advice(report: dict) -> list:
    """Lines for a step that does not fit: its largest buffers, then `memory_levers`."""

    def size(value):
        return f"{value / 2**30:.2f} GiB" if value >= 2**30 else f"{value / 2**20:.0f} MiB"

    lines = []
    allocations = report.get("largest_allocations")
    if allocations:
        lines.append(
            "  largest HBM buffers per chip (the compiler's buffer assignment; "
            "values sharing a buffer over the step):"
        )
        lines.extend(f"    {size(a['bytes']):>10}  {a['shapes']}" for a in allocations)
    else:
        lines.append("  largest buffers: not known (the compiler wrote no memory-usage report)")
    lines.append("  to shrink it:")
    lines.extend(f"    {line}" for line in memory_levers(report))
    return lines


def out_of_memory_entries(message, seconds):
    """The report's entries when the compiler raised RESOURCE_EXHAUSTED: its message, no sizes."""
    return {
        "error": message.strip().splitlines()[0][:2000],
        "compile_seconds": round(seconds, 1),
        "argument_bytes": None,
        "output_bytes": None,
        "alias_bytes": None,
        "temp_bytes": None,
        "peak_bytes": None,
        "peak_source": None,
        "computed_peak_bytes": None,
        "flops_per_chip": None,
        "collectives": None,
    }


def memory_entries(compiled, on_tpu):
    """Per-chip buffer sizes of the compiled program (memory_analysis) and its peak."""
    analysis = compiled.memory_analysis()
    sizes = {
        key: int(getattr(analysis, f"{key}_size_in_bytes"))
        for key in ("argument", "output", "alias", "temp", "generated_code")
    }
    report = {f"{k}_bytes": v for k, v in sizes.items()}
    computed = sizes["argument"] + sizes["temp"] + sizes["output"] - sizes["alias"]
    report["computed_peak_bytes"] = computed
    peak = int(getattr(analysis, "peak_memory_in_bytes", 0) or 0)
    if peak > 0 and on_tpu:
        report["peak_bytes"], report["peak_source"] = peak, "memory_analysis.peak_memory_in_bytes"
    else:
        # XLA:CPU's peak_memory_in_bytes leaves out the temporaries.
        report["peak_bytes"] = computed
        report["peak_source"] = "arguments + temporaries + outputs - aliases"
    return report
