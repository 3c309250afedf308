"""A first `generate` in a fresh process: keras_moe on TensorFlow and on JAX against HF's.

A notebook user pays a first call whenever a process starts, and again when an
input length (or, on JAX, a batch size) is new. Each measurement here is a new
Python process that builds the model (not timed) and then times, in order:

- `first_s`: the first `generate` call (tracing and compiling included);
- `warm_s`: the same call again;
- `new_length_s`: a first call at a shorter input length;
- `new_batch_s`: a first call at a larger batch size (the first length).

The model is `gin/models/switch_tiny.gin` as `decode_speed.py --model switch_tiny`
builds it (eval capacity factor 8.0, 8 experts, 8,100-token vocabulary); HF
SwitchTransformers decodes the same weights (exported by `convert.to_hf`). EOS is
disabled, so every call decodes all its tokens. The JAX rows are run twice per
repeat with one cache directory: "jax_empty_cache" starts from an empty
persistent compilation cache and fills it, "jax_warm_cache" is the next process.
Processes are interleaved over repeats; medians are reported.

    python benchmarks/first_generate.py              # batch 8, 128 inputs, 32 new tokens
    python benchmarks/first_generate.py --smoke
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

NO_EOS = -1
TIMES = ("first_s", "warm_s", "new_length_s", "new_batch_s")
# Processes run for each repeat, in this order (the warm cache reuses the empty one's).
ROWS = ("hf", "tensorflow", "jax_empty_cache", "jax_warm_cache")


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch_size", type=int, default=8)
    p.add_argument("--new_batch_size", type=int, default=32)
    p.add_argument("--inputs", type=int, default=128, help="encoder length")
    p.add_argument("--new_length", type=int, default=120, help="the second, shorter length")
    p.add_argument("--new_tokens", type=int, default=32)
    p.add_argument("--vocab_size", type=int, default=8100)
    p.add_argument("--experts", type=int, default=8)
    p.add_argument("--repeats", type=int, default=3, help="fresh processes per row")
    p.add_argument("--threads", type=int, default=os.cpu_count(), help="torch threads")
    p.add_argument("--output", default="first_generate")
    p.add_argument("--smoke", action="store_true", help="tiny sizes, for tests")
    p.add_argument("--worker", choices=("hf", "keras"), help=argparse.SUPPRESS)
    p.add_argument("--hf_dir", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.smoke:
        args.batch_size, args.new_batch_size, args.inputs, args.new_length = 2, 3, 8, 6
        args.new_tokens, args.vocab_size, args.experts, args.repeats = 4, 300, 4, 1
    for name in ("batch_size", "new_batch_size", "new_tokens", "repeats", "experts"):
        if getattr(args, name) < 1:
            p.error(f"--{name} must be >= 1, got {getattr(args, name)}")
    if not 2 <= args.new_length < args.inputs:
        p.error(f"--new_length must be in [2, --inputs), got {args.new_length}")
    return args


def _inputs(batch, length, vocab_size):
    import numpy as np

    tokens = np.random.default_rng(0).integers(2, vocab_size, size=(batch, length))
    tokens[:, -1] = 1  # EOS ends each input, as in decode_speed.py
    return tokens.astype("int32")


def _timed(call):
    start = time.perf_counter()
    call()
    return time.perf_counter() - start


def measure(generate, args):
    """`TIMES` for `generate(tokens)` called in the documented order."""
    first = _inputs(args.batch_size, args.inputs, args.vocab_size)
    return {
        "first_s": _timed(lambda: generate(first)),
        "warm_s": _timed(lambda: generate(first)),
        "new_length_s": _timed(lambda: generate(first[:, -args.new_length :])),
        "new_batch_s": _timed(
            lambda: generate(_inputs(args.new_batch_size, args.inputs, args.vocab_size))
        ),
    }


def build_switch_tiny(args):
    """The measured model, seeded: the TensorFlow processes and the HF export share weights."""
    import keras

    from benchmarks.decode_speed import switch_tiny_config
    from keras_moe import models

    keras.utils.set_random_seed(0)
    return models.build_model(switch_tiny_config(args.vocab_size, args.experts, 8.0))


def keras_worker(args):
    model = build_switch_tiny(args)
    return measure(
        lambda tokens: model.generate(tokens, max_length=args.new_tokens, eos_id=NO_EOS), args
    )


def hf_worker(args):
    import torch
    from transformers import SwitchTransformersForConditionalGeneration

    torch.set_num_threads(args.threads)
    hf = SwitchTransformersForConditionalGeneration.from_pretrained(args.hf_dir).eval()
    hf.generation_config.eos_token_id = None
    hf.generation_config.pad_token_id = 0

    def generate(tokens):
        ids = torch.from_numpy(tokens).long()
        with torch.no_grad():
            return hf.generate(
                input_ids=ids,
                attention_mask=(ids > 0).long(),
                do_sample=False,
                max_new_tokens=args.new_tokens,
                min_new_tokens=0,
                decoder_start_token_id=0,
            )

    return measure(generate, args)


def export_hf(args, path):
    """The keras_moe model's weights as an HF checkpoint (neither side drops a token)."""
    from keras_moe import convert

    convert.to_hf(build_switch_tiny(args), path, expert_capacity=args.inputs)


def run_process(row, argv, hf_dir, cache_dir):
    env = dict(os.environ, KERAS_MOE_JAX_CACHE=cache_dir)
    env.pop("JAX_COMPILATION_CACHE_DIR", None)
    worker = "hf" if row == "hf" else "keras"
    env["KERAS_BACKEND"] = "jax" if row.startswith("jax") else "tensorflow"
    done = subprocess.run(
        [sys.executable, os.path.abspath(__file__), *argv, "--worker", worker, "--hf_dir", hf_dir],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    if done.returncode:
        raise RuntimeError(f"{row} process failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def summarize(samples):
    """{row: [TIMES dicts]} -> medians, spreads and each first call over HF's."""
    rows = {
        row: {
            name: {
                "median": statistics.median(s[name] for s in runs),
                "spread": (max(s[name] for s in runs) - min(s[name] for s in runs)) / 2,
                "samples": [s[name] for s in runs],
            }
            for name in TIMES
        }
        for row, runs in samples.items()
    }
    hf_first = rows["hf"]["first_s"]["median"]
    for times in rows.values():
        times["first_over_hf_first"] = times["first_s"]["median"] / hf_first
    return rows


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    if args.worker:
        result = hf_worker(args) if args.worker == "hf" else keras_worker(args)
        print(json.dumps(result))
        return None
    from benchmarks import common

    if args.smoke:
        common.use_smoke_results()
    samples = {row: [] for row in ROWS}
    with tempfile.TemporaryDirectory() as tmp:
        hf_dir = os.path.join(tmp, "hf")
        export_hf(args, hf_dir)
        for repeat in range(args.repeats):
            cache_dir = os.path.join(tmp, f"jax_cache_{repeat}")  # empty for each repeat
            for row in ROWS:
                samples[row].append(run_process(row, argv, hf_dir, cache_dir))
                print(
                    f"repeat {repeat} {row:16s} "
                    + "  ".join(f"{name} {samples[row][-1][name]:.3f}" for name in TIMES),
                    flush=True,
                )
    rows = summarize(samples)
    for row, times in rows.items():
        print(
            f"{row:16s} first {times['first_s']['median']:.2f} s "
            f"({times['first_over_hf_first']:.2f}x HF's first), warm "
            f"{times['warm_s']['median']:.3f} s, new length {times['new_length_s']['median']:.2f}"
            f" s, new batch {times['new_batch_s']['median']:.2f} s"
        )
    path = common.write_result(
        args.output,
        {
            "benchmark": "first_generate",
            "args": vars(args),
            "environment": common.environment(),
            "rows": rows,
            "target": "first call <= 2x HF's first call at batch 8",
            "targets_met": {row: rows[row]["first_over_hf_first"] <= 2.0 for row in ROWS[1:]},
            "command": "python benchmarks/first_generate.py " + " ".join(argv),
        },
    )
    print(f"wrote {path}")
    return path


if __name__ == "__main__":
    main()
