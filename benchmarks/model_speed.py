"""Training-step tokens/s of the tiny Switch T5 vs HF SwitchTransformers, same config, same run.

Both models have the same architecture and the same weights (the keras_moe
model is exported with `keras_moe.convert.to_hf` and loaded by HF
transformers on torch CPU), the same batch, and Adam. Steps are interleaved;
the report is the median tokens/s of each and their ratio (target >= 1.5x).
keras_moe is measured twice: with the default graph step, and compiled by XLA
(`jit_compile=True`, what TPU runs use; off by default on CPU).

    python benchmarks/model_speed.py
    python benchmarks/model_speed.py --batch_size 32 --inputs 256 --targets 64
    python benchmarks/model_speed.py --smoke
"""

import argparse
import functools
import os
import sys
import tempfile

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import keras  # noqa: E402
import numpy as np  # noqa: E402

from benchmarks import common  # noqa: E402
from keras_moe import (  # noqa: E402
    SwitchFeedForward,
    convert,
    models,
)


def tiny_switch_config(vocab_size, num_experts, capacity):
    """gin/models/switch_tiny.gin's architecture, routed as HF routes: per-sequence
    groups with a fixed capacity (the "batch" groups of the default would give a whole
    batch the capacity HF gives one sequence)."""
    return models.T5Config(
        vocab_size=vocab_size,
        d_model=128,
        num_heads=4,
        d_kv=32,
        d_ff=256,
        num_encoder_layers=2,
        num_decoder_layers=2,
        activation="relu",
        encoder_sparse_layers=[1],
        decoder_sparse_layers=[1],
        tie_word_embeddings=True,
        sparse_ffn=functools.partial(
            SwitchFeedForward,
            num_experts=num_experts,
            d_ff=256,
            activation="relu",
            train_capacity_factor=1e-6,
            eval_capacity_factor=1e-6,
            min_expert_capacity=capacity,
            z_loss_factor=0.0,
            group_size="sequence",
        ),
    )


def make_batch(rng, batch_size, inputs, targets, vocab_size):
    enc = rng.integers(2, vocab_size, size=(batch_size, inputs)).astype("int32")
    tgt = rng.integers(2, vocab_size, size=(batch_size, targets)).astype("int32")
    dec_in = np.concatenate([np.zeros((batch_size, 1), "int32"), tgt[:, :-1]], axis=1)
    weights = np.ones_like(tgt, dtype="float32")
    return enc, dec_in, tgt, weights


def keras_step(model, batch, jit_compile=False):
    enc, dec_in, tgt, weights = batch
    x = {"encoder_input_tokens": enc, "decoder_input_tokens": dec_in}
    model.compile(
        **model.compile_defaults(optimizer=keras.optimizers.Adam(1e-3), jit_compile=jit_compile)
    )
    model.train_on_batch(x, tgt, sample_weight=weights)  # trace
    return lambda: model.train_on_batch(x, tgt, sample_weight=weights)


def hf_step(path, batch, threads, aux_loss_factor):
    import torch
    from transformers import SwitchTransformersForConditionalGeneration

    torch.set_num_threads(threads)
    model = SwitchTransformersForConditionalGeneration.from_pretrained(path).train()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    enc, dec_in, tgt, _ = (torch.from_numpy(a) for a in batch)

    def step():
        optimizer.zero_grad(set_to_none=True)
        out = model(
            input_ids=enc.long(),
            decoder_input_ids=dec_in.long(),
            labels=tgt.long(),
            output_router_logits=aux_loss_factor > 0,
        )
        out.loss.backward()
        optimizer.step()
        return float(out.loss.detach())

    step()
    return step


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch_size", type=int, default=16)
    parser.add_argument("--inputs", type=int, default=128)
    parser.add_argument("--targets", type=int, default=32)
    parser.add_argument("--vocab_size", type=int, default=8100)
    parser.add_argument("--experts", type=int, default=8)
    parser.add_argument("--capacity_factor", type=float, default=1.25)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--output", default="model_speed")
    parser.add_argument(
        "--no_xla", action="store_true", help="skip the keras_moe run with jit_compile=True"
    )
    parser.add_argument("--smoke", action="store_true")
    args = parser.parse_args(argv)
    if args.smoke:
        from benchmarks.common import use_smoke_results

        use_smoke_results()  # results/smoke/, not the committed files
        args.batch_size, args.inputs, args.targets, args.vocab_size = 2, 16, 8, 300
        args.experts, args.repeats = 4, 2
    capacity = int(np.ceil(args.capacity_factor * args.inputs / args.experts))
    config = tiny_switch_config(args.vocab_size, args.experts, capacity)
    keras.utils.set_random_seed(0)
    model = models.build_model(config)
    batch = make_batch(
        np.random.default_rng(0), args.batch_size, args.inputs, args.targets, args.vocab_size
    )
    model({"encoder_input_tokens": batch[0], "decoder_input_tokens": batch[1]})
    with tempfile.TemporaryDirectory() as path:
        convert.to_hf(model, path, expert_capacity=capacity)
        steps = {
            "hf_switch_torch": hf_step(
                path, batch, args.threads, config.sparse_option("aux_loss_factor")
            )
        }
    steps["keras_moe"] = keras_step(model, batch)
    if not args.no_xla:
        xla_model = models.build_model(config)
        xla_model({"encoder_input_tokens": batch[0], "decoder_input_tokens": batch[1]})
        xla_model.set_weights(model.get_weights())
        steps["keras_moe_xla"] = keras_step(xla_model, batch, jit_compile=True)
    timings = common.interleaved_medians(steps, args.repeats, warmup=1)
    tokens = args.batch_size * (args.inputs + args.targets)
    result = {
        name: {
            "median_s": t["median"],
            "spread_s": t["spread"],
            "tokens_per_s": tokens / t["median"],
        }
        for name, t in timings.items()
    }
    hf = result["hf_switch_torch"]["tokens_per_s"]
    ratio = result["keras_moe"]["tokens_per_s"] / hf
    ratio_xla = result["keras_moe_xla"]["tokens_per_s"] / hf if "keras_moe_xla" in result else None
    for name, r in result.items():
        print(f"{name:16s} {r['median_s'] * 1e3:8.1f} ms/step  {r['tokens_per_s']:9.0f} tokens/s")
    print(f"keras_moe / HF tokens/s: {ratio:.2f}x")
    if ratio_xla is not None:
        print(f"keras_moe (jit_compile=True) / HF tokens/s: {ratio_xla:.2f}x")
    path = common.write_result(
        args.output,
        {
            "benchmark": "model_speed",
            "args": vars(args),
            "environment": common.environment(),
            "tokens_per_step": tokens,
            "params": models.count_params(config),
            "results": result,
            "ratio_keras_moe_over_hf": ratio,
            "ratio_keras_moe_xla_over_hf": ratio_xla,
            "command": "python benchmarks/model_speed.py " + " ".join(argv or sys.argv[1:]),
        },
    )
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
