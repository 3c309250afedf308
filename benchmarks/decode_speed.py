"""Decoding tokens/s of the tiny Switch T5 against HF SwitchTransformers `generate`, same weights.

The keras_moe model is exported with `keras_moe.convert.to_hf` and loaded by
HF transformers on torch CPU, so both decode the same weights. For each batch
size and number of new tokens, greedy and beam-4 search of both libraries are
timed interleaved in one run (median of `--repeats`), with EOS disabled so
that every run produces exactly the requested number of tokens: keras_moe's
compiled search (`tf.function`), the same with XLA (`jit_compile=True`), the
exported SavedModel (`export_for_serving`), and, with `--eager`, the eager
reference loop. The JSON also says whether the greedy tokens equal HF's and
the SavedModel's.
Targets at batch 32: keras_moe >= 2x HF greedy and >= 1.5x HF beam-4; at
batch 1 no slower than HF.

    python benchmarks/decode_speed.py                  # batch 1 and 32, 32 and 128 tokens
    python benchmarks/decode_speed.py --batch_sizes 8 --new_tokens 32 --eager
    python benchmarks/decode_speed.py --smoke
    # a default user call: gin/models/switch_tiny.gin as written (batch groups, eval cf 8.0)
    python benchmarks/decode_speed.py --model switch_tiny --batch_sizes 8 32 --new_tokens 32 \
        --inputs 128 --output decode_speed_switch_tiny

`first_call_s` is each function's first call on a new input shape, tracing included.
"""

import argparse
import os
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import keras  # noqa: E402
import numpy as np  # noqa: E402

from benchmarks import common  # noqa: E402
from benchmarks.model_speed import tiny_switch_config  # noqa: E402
from keras_moe import convert, gin_config, models  # noqa: E402

NO_EOS = -1  # an id no search produces: every run decodes all its tokens


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch_sizes", type=int, nargs="+", default=[1, 32])
    p.add_argument("--new_tokens", type=int, nargs="+", default=[32, 128])
    p.add_argument("--inputs", type=int, default=64, help="encoder length")
    p.add_argument("--beams", type=int, default=4)
    p.add_argument("--vocab_size", type=int, default=8100)
    p.add_argument("--experts", type=int, default=8)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=os.cpu_count(), help="torch threads")
    p.add_argument("--eager", action="store_true", help="also time the eager reference loop")
    p.add_argument("--no_xla", action="store_true")
    p.add_argument("--no_saved_model", action="store_true")
    p.add_argument(
        "--model",
        choices=("benchmark", "switch_tiny"),
        default="benchmark",
        help="benchmark: model_speed.py's tiny_switch_config, routed as HF routes; "
        "switch_tiny: gin/models/switch_tiny.gin with its default routing",
    )
    p.add_argument(
        "--eval_capacity_factor", type=float, default=8.0, help="with --model switch_tiny"
    )
    p.add_argument("--output", default="decode_speed")
    p.add_argument("--smoke", action="store_true", help="tiny sizes, for tests")
    args = p.parse_args(argv)
    if args.smoke:
        from benchmarks.common import use_smoke_results

        use_smoke_results()  # results/smoke/, not the committed files
        args.batch_sizes, args.new_tokens, args.inputs = [2], [4], 8
        args.vocab_size, args.experts, args.repeats, args.beams = 300, 4, 1, 2
    for name in ("batch_sizes", "new_tokens"):
        if min(getattr(args, name)) < 1:
            p.error(f"--{name} must be >= 1")
    if args.inputs < 2 or args.beams < 1 or args.repeats < 1:
        p.error("--inputs must be >= 2, --beams and --repeats >= 1")
    return args


def switch_tiny_config(vocab_size, experts, eval_capacity_factor):
    """`gin/models/switch_tiny.gin` as written but for its vocabulary, experts and eval cf."""
    return gin_config.parse_gin(
        "switch_tiny.gin",
        [
            f"SwitchFeedForward.eval_capacity_factor = {eval_capacity_factor}",
            f"T5Config.vocab_size = {vocab_size}",
            f"SwitchFeedForward.num_experts = {experts}",
        ],
    )


def keras_functions(model, enc, new_tokens, beams, args, saved):
    """name -> callable returning int tokens [B, new_tokens] (greedy) or [B, <=new] (beam)."""
    import tensorflow as tf

    def gen(method, **kwargs):
        return lambda: model.generate(
            enc, max_length=new_tokens, method=method, num_beams=beams, eos_id=NO_EOS, **kwargs
        )

    out = {"keras_moe_greedy": gen("greedy"), "keras_moe_beam": gen("beam")}
    if not args.no_xla:
        out["keras_moe_xla_greedy"] = gen("greedy", jit_compile=True)
        out["keras_moe_xla_beam"] = gen("beam", jit_compile=True)
    if args.eager:
        out["keras_moe_eager_greedy"] = gen("greedy", compiled=False)
        out["keras_moe_eager_beam"] = gen("beam", compiled=False)
    for method, served in saved.items():
        signature = served.signatures["generate_ids"]
        tokens = tf.constant(enc)
        out[f"saved_model_{method}"] = lambda s=signature, t=tokens: s(encoder_input_tokens=t)[
            "output_tokens"
        ].numpy()
    return out


def hf_functions(hf, enc, new_tokens, beams):
    import torch

    ids, mask = torch.from_numpy(enc).long(), torch.from_numpy(enc > 0).long()

    def gen(num_beams):
        # length_penalty 0: beams ranked by their summed log-probability, as keras_moe's.
        extra = {"length_penalty": 0.0} if num_beams > 1 else {}

        def run():
            with torch.no_grad():
                return hf.generate(
                    input_ids=ids,
                    attention_mask=mask,
                    do_sample=False,
                    num_beams=num_beams,
                    max_new_tokens=new_tokens,
                    min_new_tokens=0,
                    decoder_start_token_id=0,
                    **extra,
                ).numpy()[:, 1:]

        return run

    return {"hf_greedy": gen(1), "hf_beam": gen(beams)}


def main(argv=None):
    args = parse_args(argv)
    import torch
    from transformers import SwitchTransformersForConditionalGeneration

    torch.set_num_threads(args.threads)
    if args.model == "switch_tiny":
        capacity = args.inputs  # HF's experts take a whole sequence: neither side drops
        config = switch_tiny_config(args.vocab_size, args.experts, args.eval_capacity_factor)
    else:
        capacity = int(np.ceil(1.25 * args.inputs / args.experts))
        config = tiny_switch_config(args.vocab_size, args.experts, capacity)
    keras.utils.set_random_seed(0)
    model = models.build_model(config)
    rng = np.random.default_rng(0)
    cases = []
    with tempfile.TemporaryDirectory() as tmp:
        convert.to_hf(model, os.path.join(tmp, "hf"), expert_capacity=capacity)
        hf = SwitchTransformersForConditionalGeneration.from_pretrained(
            os.path.join(tmp, "hf")
        ).eval()
        hf.generation_config.eos_token_id = None  # decode every requested token
        hf.generation_config.pad_token_id = 0
        for new_tokens in args.new_tokens:
            saved = {}
            if not args.no_saved_model:
                import tensorflow as tf

                for method in ("greedy", "beam"):
                    path = model.export_for_serving(
                        os.path.join(tmp, f"served_{method}_{new_tokens}"),
                        max_input_length=args.inputs,
                        max_length=new_tokens,
                        method=method,
                        num_beams=args.beams,
                        eos_id=NO_EOS,
                    )
                    saved[method] = tf.saved_model.load(path)
            for batch in args.batch_sizes:
                enc = rng.integers(2, args.vocab_size, size=(batch, args.inputs)).astype("int32")
                enc[:, -1] = config.eos_id
                functions = {
                    **hf_functions(hf, enc, new_tokens, args.beams),
                    **keras_functions(model, enc, new_tokens, args.beams, args, saved),
                }
                first_call = {}
                for name in ("keras_moe_greedy", "keras_moe_beam"):
                    start = time.perf_counter()
                    outputs = functions[name]()
                    first_call[name] = time.perf_counter() - start
                    if name == "keras_moe_greedy":
                        greedy = outputs
                same = np.array_equal(greedy, functions["hf_greedy"]())
                same_saved = (
                    np.array_equal(functions["saved_model_greedy"](), greedy) if saved else None
                )
                timings = common.interleaved_medians(functions, args.repeats, warmup=1)
                tokens = batch * new_tokens
                result = {
                    name: {
                        "median_s": t["median"],
                        "spread_s": t["spread"],
                        "tokens_per_s": tokens / t["median"],
                        **({"first_call_s": first_call[name]} if name in first_call else {}),
                    }
                    for name, t in timings.items()
                }
                ratios = {
                    name: r["tokens_per_s"]
                    / result["hf_beam" if name.endswith("beam") else "hf_greedy"]["tokens_per_s"]
                    for name, r in result.items()
                    if not name.startswith("hf_")
                }
                case = {
                    "batch_size": batch,
                    "new_tokens": new_tokens,
                    "results": result,
                    "ratio_over_hf": ratios,
                    "greedy_tokens_equal_hf": bool(same),
                    "saved_model_greedy_tokens_equal": same_saved,
                }
                cases.append(case)
                print(f"batch {batch}, {new_tokens} new tokens (greedy tokens equal HF: {same})")
                for name, r in result.items():
                    ratio = f"{ratios[name]:5.2f}x HF" if name in ratios else ""
                    print(f"  {name:24s} {r['tokens_per_s']:9.0f} tokens/s  {ratio}")
    targets = {}
    for case in cases:
        key = f"batch{case['batch_size']}_new{case['new_tokens']}"
        r = case["ratio_over_hf"]
        if case["batch_size"] >= 32:
            targets[key] = {
                "greedy_2x": r["keras_moe_greedy"] >= 2.0,
                "beam_1.5x": r["keras_moe_beam"] >= 1.5,
            }
        elif case["batch_size"] == 1:
            targets[key] = {
                "greedy_not_slower": r["keras_moe_greedy"] >= 1.0,
                "beam_not_slower": r["keras_moe_beam"] >= 1.0,
            }
    path = common.write_result(
        args.output,
        {
            "benchmark": "decode_speed",
            "args": vars(args),
            "environment": common.environment(),
            "params": models.count_params(config),
            "model": (
                "gin/models/switch_tiny.gin (d_model 64, 2+2 layers, MoE in layer 1 of each "
                f"stack), eval capacity factor {args.eval_capacity_factor}, default routing"
                if args.model == "switch_tiny"
                else "benchmarks/model_speed.py "
                "tiny_switch_config (d_model 128, 2+2 layers, MoE in layer 1 of each stack)"
            ),
            "cases": cases,
            "targets_met": targets,
            "command": "python benchmarks/decode_speed.py " + " ".join(argv or sys.argv[1:]),
        },
    )
    print(f"wrote {path}")
    return path


if __name__ == "__main__":
    main()
