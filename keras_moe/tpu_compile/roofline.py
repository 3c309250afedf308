"""A roofline lower bound on a compiled train step's time, and the MFU it implies.

The compiled program gives one chip's FLOPs and HBM bytes per step
(`cost_analysis`) and its collectives (the partitioned HLO); each TPU
generation's published peak bf16 FLOP/s, HBM bandwidth and inter-chip
interconnect (ICI) bandwidth turn them into three times. A step cannot be
faster than the largest of them, even if the compiler overlapped everything
perfectly, so that largest time is a lower bound on the step time, and the
model FLOPs utilisation (MFU) at that bound is an upper bound on what the
job can reach on that slice.

Assumptions, stated in every report:
- all matmuls at the bf16 peak (float32 matmuls run as bf16 passes at best);
- HBM traffic is `bytes accessed` of the cost analysis (XLA's estimate);
- a collective moves, per chip, the bytes a bandwidth-optimal algorithm must
  send: all-gather `(n-1)` shards, all-to-all and reduce-scatter `(n-1)/n`
  of the operand, all-reduce twice that, collective-permute the operand;
  all of a chip's ICI links send at once (half the bidirectional bandwidth);
- model FLOPs are `6 x` parameters x tokens through them (each token's `k`
  experts only) plus attention's score and value matmuls, as PaLM counts
  MFU; embedding lookups, norms and the router's softmax are left out.
"""

import dataclasses

from keras_moe.tpu_compile import hlo_collectives


@dataclasses.dataclass(frozen=True)
class ChipSpec:
    """Published per-chip peaks of one TPU generation.

    Attributes:
        peak_flops: dense bf16 FLOP/s.
        hbm_bytes_per_second: HBM bandwidth.
        ici_bytes_per_second: bidirectional inter-chip bandwidth, all links.
        source: where the figures come from.
    """

    peak_flops: float
    hbm_bytes_per_second: float
    ici_bytes_per_second: float
    source: str


CHIPS = {
    "v4": ChipSpec(
        275e12,
        1200e9,
        6 * 2 * 45e9,
        "Cloud TPU v4 docs (275 TFLOP/s, 1200 GB/s); ICI: 6 links x 45 GB/s "
        "each way (How to Scale Your Model, TPU chapter)",
    ),
    "v5e": ChipSpec(
        197e12,
        819e9,
        400e9,
        "Cloud TPU v5e docs (197 TFLOP/s, 819 GB/s, ICI 400 GB/s bidirectional)",
    ),
    "v5p": ChipSpec(
        459e12,
        2765e9,
        1200e9,
        "Cloud TPU v5p docs (459 TFLOP/s, 2765 GB/s, ICI 1200 GB/s bidirectional)",
    ),
    "v6e": ChipSpec(
        918e12,
        1638e9,
        800e9,
        "Cloud TPU v6e docs (918 TFLOP/s, 1638 GB/s, ICI 800 GB/s bidirectional)",
    ),
}


def collective_bytes(hlo, num_devices):
    """Bytes one chip sends per step for each kind of collective in `hlo`.

    A collective's bytes received per chip (`hlo_collectives`: what a
    bandwidth-optimal algorithm moves) equal the bytes each chip sends.

    Args:
        hlo: the text of the compiled (partitioned) HLO module: shapes per chip.
        num_devices: the chips, for collectives over all of them.

    Returns:
        {kind: bytes} for the kinds present, "-" written "_" (`all_to_all`, ...).

    Example:
    >>> hlo = ("%a = bf16[4,8]{1,0} all-to-all(%x), replica_groups={{0,1,2,3}}\\n"
    ...        "%g = f32[8,16]{1,0} all-gather(%y), replica_groups=[1,4]<=[4]")
    >>> collective_bytes(hlo, 4)  # 64 B x 3/4; 3 of the 4 shards of 128 B
    {'all_to_all': 48.0, 'all_gather': 384.0}
    """
    sent = {}
    for c in hlo_collectives.collectives(hlo, num_devices):
        key = c.kind.replace("-", "_")
        sent[key] = sent.get(key, 0.0) + c.received_bytes
    return sent


def _attention_flops(heads_dim, queries, keys):
    """Forward FLOPs of scores and weighted values: two [q, k] x inner matmuls."""
    return 2 * 2 * queries * keys * heads_dim


def model_flops_per_step(model, batch_size, inputs_length, targets_length):
    """Training FLOPs of one step of an `EncoderDecoder`, counted from its shapes.

    `6 x` parameters x the tokens that use them (encoder layers: input tokens;
    decoder layers: target tokens, cross-attention keys/values: input tokens;
    experts: a token's `k` experts of `E`; the output projection: target
    tokens) plus 3 x attention's score and value matmuls.

    Args:
        model: an `EncoderDecoder` (built or abstract).
        batch_size: sequences per step.
        inputs_length, targets_length: tokens per sequence.

    Example:
    >>> from keras_moe.models import EncoderDecoder, T5Config
    >>> model = EncoderDecoder(T5Config(vocab_size=32, d_model=16, num_heads=2, d_kv=8,
    ...     d_ff=32, num_encoder_layers=1, num_decoder_layers=1))
    >>> model_flops_per_step(model, 2, 8, 4) > 6 * 2 * 4 * 32 * 16  # at least the logits
    True
    """
    inputs, targets = batch_size * inputs_length, batch_size * targets_length
    config = model.config
    inner = config.num_heads * config.head_dim
    flops = 0.0
    for side, layers, tokens in (
        ("encoder", model.encoder_layers, inputs),
        ("decoder", model.decoder_layers, targets),
    ):
        for block in layers:
            for variable in block.trainable_variables:
                if len(variable.shape) < 2 or "/router/" in variable.path:
                    continue
                size = 1
                for d in variable.shape:
                    size *= int(d)
                used_by = tokens
                if (
                    "cross_attention/key" in variable.path
                    or "cross_attention/value" in variable.path
                ):
                    used_by = inputs
                if "/experts/" in variable.path:  # each token reaches k of the E experts
                    ffn = block.ffn
                    size = size * ffn.router.slots_per_token() / ffn.num_experts
                flops += 6 * size * used_by
            length = inputs_length if side == "encoder" else targets_length
            flops += 3 * batch_size * _attention_flops(inner, length, length)
            if side == "decoder":
                flops += 3 * batch_size * _attention_flops(inner, targets_length, inputs_length)
    flops += 6 * config.vocab_size * config.d_model * targets  # the output projection
    return flops


def estimate(
    flops_per_chip,
    bytes_accessed_per_chip,
    sent_bytes_per_chip,
    generation,
    model_flops_per_chip=None,
):
    """The roofline bound of one step on a chip of `generation`.

    Args:
        flops_per_chip: the compiled program's FLOPs per step and chip.
        bytes_accessed_per_chip: its HBM bytes per step and chip (None: unknown).
        sent_bytes_per_chip: {collective kind: bytes} (`collective_bytes`).
        generation: "v4", "v5e", "v5p" or "v6e".
        model_flops_per_chip: the model's FLOPs per step and chip, for MFU.

    Returns:
        a dict of `compute_seconds`, `memory_seconds`, `ici_seconds`,
        `bound_seconds` (their maximum), `bound_by`, `mfu_at_bound` (None
        without model FLOPs) and the chip's figures; None for a generation
        without published figures here.

    Example:
    >>> r = estimate(197e12, 0.0, {}, "v5e", model_flops_per_chip=98.5e12)
    >>> r["bound_seconds"], r["bound_by"], r["mfu_at_bound"]
    (1.0, 'compute', 0.5)
    """
    chip = CHIPS.get(generation)
    if chip is None or flops_per_chip is None:
        return None
    times = {
        "compute": flops_per_chip / chip.peak_flops,
        "memory": (bytes_accessed_per_chip or 0.0) / chip.hbm_bytes_per_second,
        "ici": sum(sent_bytes_per_chip.values()) / (chip.ici_bytes_per_second / 2),
    }
    bound_by = max(times, key=times.get)
    bound = times[bound_by]
    mfu = None
    if model_flops_per_chip is not None and bound > 0:
        mfu = model_flops_per_chip / (bound * chip.peak_flops)
    return {
        "compute_seconds": times["compute"],
        "memory_seconds": times["memory"],
        "ici_seconds": times["ici"],
        "bound_seconds": bound,
        "bound_by": bound_by,
        "mfu_at_bound": mfu,
        "model_flops_per_chip": model_flops_per_chip,
        "chip": dataclasses.asdict(chip),
    }


def format_estimate(roofline):
    """Report lines of `estimate`'s result."""
    if roofline is None:
        return ["  roofline: n/a (no published figures for this target)"]
    lines = [
        f"  roofline lower bound on the step: {roofline['bound_seconds'] * 1e3:.3g} ms "
        f"({roofline['bound_by']}-bound; compute {roofline['compute_seconds'] * 1e3:.3g} ms, "
        f"HBM {roofline['memory_seconds'] * 1e3:.3g} ms, ICI {roofline['ici_seconds'] * 1e3:.3g}"
        " ms)",
    ]
    if roofline["mfu_at_bound"] is not None:
        lines.append(
            f"    MFU at that bound: {roofline['mfu_at_bound']:.1%} (model FLOPs "
            f"{roofline['model_flops_per_chip']:.4g} per chip; the best this slice "
            "can reach)"
        )
    lines.append(
        f"    assumes perfect overlap, bf16 peak, bandwidth-optimal collectives; "
        f"{roofline['chip']['source']}"
    )
    return lines
