"""The collectives of a compiled (partitioned) XLA program and the bytes they move per device.

A compiled SPMD program is one device's program, so the shapes of its
collectives are per-device shapes. The bytes a device receives, for a
replica group of `n` devices (ring/bucket algorithms, the usual accounting):

- all-to-all: its result minus the block it keeps, `result * (n - 1) / n`;
- all-gather: the same, `result * (n - 1) / n`;
- reduce-scatter: `operand * (n - 1) / n`, i.e. `result * (n - 1)`;
- all-reduce: `2 * operand * (n - 1) / n` (a reduce-scatter then an all-gather);
- collective-permute: its result.

Example:
>>> hlo = ('%a = f32[8,1,3,16]{3,2,1,0} all-to-all(%p), channel_id=1, '
...        'replica_groups={{0,1,2,3}}, dimensions={0}, metadata={op_name="jit(f)/x"}')
>>> [(c.kind, c.result_bytes, c.group_size, c.received_bytes) for c in collectives(hlo)]
[('all-to-all', 1536, 4, 1152.0)]
"""

import re
from typing import NamedTuple

KINDS = (
    "all-to-all",
    "ragged-all-to-all",
    "all-gather",
    "all-reduce",
    "reduce-scatter",
    "collective-permute",
)
_BYTES = {
    "pred": 1,
    "s8": 1,
    "u8": 1,
    "s16": 2,
    "u16": 2,
    "f16": 2,
    "bf16": 2,
    "s32": 4,
    "u32": 4,
    "f32": 4,
    "s64": 8,
    "u64": 8,
    "f64": 8,
    "c64": 8,
    "c128": 16,
}
_INSTRUCTION = re.compile(
    r"^\s*(?:ROOT\s+)?%?[\w.\-]+\s*=\s*(?P<shape>.+?)\s+"
    r"(?P<kind>" + "|".join(KINDS) + r")(?:-start)?\((?P<rest>.*)$"
)
_ARRAY = re.compile(r"\b(" + "|".join(_BYTES) + r")\[([\d,]*)\]")


class Collective(NamedTuple):
    kind: str
    result_bytes: int
    group_size: int
    received_bytes: float
    op_name: str
    dims: tuple = ()  # the (last) result array's per-device dimensions


def shape_bytes(shape_text):
    """Bytes of an HLO shape ("f32[2,3]{1,0}" or a tuple of them)."""
    total = 0
    for dtype, dims in _ARRAY.findall(shape_text):
        count = 1
        for d in filter(None, dims.split(",")):
            count *= int(d)
        total += count * _BYTES[dtype]
    return total


def _group_size(rest):
    groups = re.search(r"replica_groups=\{\{([\d,]*)\}", rest)
    if groups:
        return len(groups.group(1).split(","))
    iota = re.search(r"replica_groups=\[(\d+),(\d+)\]", rest)  # [groups, size]<=[...]
    if iota:
        return int(iota.group(2))
    # replica_groups=mesh['axis_0'=4,'axis_1'=2] {'axis_0'}: a group spans the listed axes.
    named = re.search(r"replica_groups=mesh\[([^\]]*)\]\s*\{([^}]*)\}", rest)
    if named:
        sizes = dict(re.findall(r"'([^']+)'=(\d+)", named.group(1)))
        size = 1
        for axis in re.findall(r"'([^']+)'", named.group(2)):
            size *= int(sizes.get(axis, 1))
        return size
    return None


def collectives(hlo_text, num_devices=1):
    """The collective instructions of `hlo_text` (a compiled program's `as_text()`).

    Asynchronous pairs (`all-gather-start` / `-done`) count once, at the start.
    A collective without replica groups (`replica_groups={}`) spans all
    `num_devices` devices.
    """
    out = []
    for line in hlo_text.splitlines():
        match = _INSTRUCTION.match(line)
        if not match:
            continue
        kind, rest = match.group("kind"), match.group("rest")
        result = shape_bytes(match.group("shape"))
        arrays = _ARRAY.findall(match.group("shape"))
        dims = tuple(int(d) for d in arrays[-1][1].split(",") if d) if arrays else ()
        if (
            kind in ("all-gather", "all-reduce", "collective-permute")
            and match.group(0).find(f"{kind}-start(") >= 0
        ):
            # The start's result is a tuple (operand, result): count the result only.
            arrays = _ARRAY.findall(match.group("shape"))
            if len(arrays) >= 2:
                result = shape_bytes("{}[{}]".format(*arrays[-1]))
        n = _group_size(rest) or num_devices
        share = (n - 1) / n if n > 1 else 0.0
        received = {
            "all-reduce": 2 * result * share,
            "collective-permute": float(result),
            "reduce-scatter": float(result * (n - 1)),
        }.get(kind, result * share)
        op_name = re.search(r'op_name="([^"]*)"', rest)
        out.append(Collective(kind, result, n, received, op_name.group(1) if op_name else "", dims))
    return out


def summarize(hlo_text, num_devices=1):
    """{kind: {"count": n, "received_bytes": per-device bytes}} over `hlo_text`."""
    summary = {kind: {"count": 0, "received_bytes": 0.0} for kind in KINDS}
    for c in collectives(hlo_text, num_devices):
        summary[c.kind]["count"] += 1
        summary[c.kind]["received_bytes"] += c.received_bytes
    return summary


def is_weight_shape(dims, weights):
    """True when `dims` lies between a weight's per-device shard and its full shape.

    An all-gather of a weight (FSDP-style, or a weight laid out over an axis
    its consumer needs whole) returns the weight or a partly gathered shard
    of it: each dimension at least the shard's and dividing the full one.

    Args:
        dims: a collective's result dimensions (per device).
        weights: `(full shape, shard shape)` pairs of the step's variables.

    Example:
    >>> is_weight_shape((8, 64, 128), [((8, 64, 128), (2, 64, 128))])
    True
    >>> is_weight_shape((4, 32, 64), [((8, 64, 128), (2, 64, 128))])
    False
    """
    for full, shard in weights:
        if len(full) == len(dims) and all(
            s <= d <= f and f % d == 0 for d, f, s in zip(dims, full, shard, strict=False)
        ):
            return True
    return False


def activation_all_gathers(hlo_text, weights, num_devices=1):
    """The all-gathers of `hlo_text` whose result is not shaped like a weight.

    The heuristic: a gathered weight keeps the weight's shape (between its
    shard and its full shape, `is_weight_shape`); anything else gathered --
    tokens, hidden states, router outputs, routing buffers -- is an
    activation, whose size grows with the batch. Scalars are left out. A
    weight reshaped before its gather counts as an activation, and an
    activation shaped like a weight as a weight.

    Example:
    >>> hlo = ('%g = f32[8,32,64]{2,1,0} all-gather(%x), replica_groups={{0,1}}, dimensions={0}\\n'
    ...        '%w = f32[8,64,128]{2,1,0} all-gather(%k), replica_groups={{0,1}}, dimensions={0}')
    >>> [c.dims for c in activation_all_gathers(hlo, [((8, 64, 128), (4, 64, 128))])]
    [(8, 32, 64)]
    """
    return [
        c
        for c in collectives(hlo_text, num_devices)
        if c.kind == "all-gather" and c.dims and not is_weight_shape(c.dims, weights)
    ]
