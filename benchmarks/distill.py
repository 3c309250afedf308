"""Distilling a Switch teacher into a dense T5 student (Switch Transformer §4.2, Table 6).

On the quality benchmark's setup (`quality.py`: T5 prefix LM on the Debian
docs, d_model 64, 4+4 layers, gated-GELU, Adam 3e-3 constant, the whole
validation split as held-out set), for each of `--seeds` seeds: a dense T5
baseline and a Switch teacher (`--experts`, MoE FFN in every other layer) train
`--steps` steps on the same batches; the teacher is then distilled into a dense
student of the baseline's shape (non-expert weights copied from the teacher,
loss 0.75 hard + 0.25 soft) for `--student_steps`. Reports each model's
held-out negative log perplexity (mean ± std over seeds) and the fraction of
the teacher's gain over the baseline that the student keeps,
`(student - dense) / (teacher - dense)` (paper: 29-37%), with its noise.

The student has seen `--steps + --student_steps` batches in all (the teacher's,
then its own), so the dense baseline trained on for `--student_steps` more is
reported as that control, with the fraction kept against it.

    python benchmarks/distill.py                       # 3 seeds, Switch-16: ~45 min on 2 cores
    python benchmarks/distill.py --smoke               # a minute; checks it runs

The docs task needs `apt-get install -y python3.11-doc perl-doc`; without the
Debian docs the embedded English corpus is used and the JSON says so.
Writes `benchmarks/results/distill.json`.
"""

import argparse
import os
import statistics
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks import (  # after the environment defaults
    quality_args,
    quality_batches,
    quality_models,
    quality_training,
)

MODELS = ("dense_baseline", "dense_baseline_more_steps", "switch_teacher", "distilled_student")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--task",
        default="docs_prefix_lm",
        help=f"seqio task; {quality_args.FALLBACK_TASK} if its data is missing",
    )
    p.add_argument("--inputs", type=int, default=64, help="encoder length")
    p.add_argument(
        "--targets", type=int, default=None, help="decoder length (default: --inputs for prefix LM)"
    )
    p.add_argument("--batch_size", type=int, default=16)
    p.add_argument("--steps", type=int, default=800, help="training steps of baseline and teacher")
    p.add_argument(
        "--student_steps", type=int, default=None, help="distillation steps (default: --steps)"
    )
    p.add_argument(
        "--eval_batches", type=int, default=0, help="validation batches (0: the whole split)"
    )
    p.add_argument("--d_model", type=int, default=64)
    p.add_argument("--d_ff", type=int, default=128)
    p.add_argument("--num_heads", type=int, default=4)
    p.add_argument("--layers", type=int, default=4, help="encoder and decoder layers each")
    p.add_argument("--activation", default="gated-gelu")
    p.add_argument("--experts", type=int, default=16, help="the teacher's experts")
    p.add_argument("--learning_rate", type=float, default=3e-3, help="Adam, constant")
    p.add_argument("--alpha", type=float, default=0.25, help="weight of the soft term")
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--expert_init", default="none", choices=["none", "mean", "expert0"])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--seeds", type=int, default=3, help="seeds --seed, --seed + 1, ...")
    p.add_argument("--output", default="distill", help="result name under benchmarks/results/")
    p.add_argument("--smoke", action="store_true", help="tiny sizes, for tests")
    args = p.parse_args(argv)
    if args.smoke:  # tiny defaults; arguments given explicitly still win
        from benchmarks.common import use_smoke_results

        use_smoke_results()  # results/smoke/, not the committed files
        p.set_defaults(
            inputs=32,
            batch_size=2,
            steps=4,
            eval_batches=1,
            d_model=16,
            d_ff=32,
            num_heads=2,
            layers=2,
            experts=2,
            seeds=2,
            task=quality_args.FALLBACK_TASK,
        )
        args = p.parse_args(argv)
    if args.student_steps is None:
        args.student_steps = args.steps
    for name in ("steps", "student_steps", "seeds", "experts"):
        if getattr(args, name) < 1:
            p.error(f"--{name} must be >= 1, got {getattr(args, name)}")
    if args.eval_batches < 0:
        p.error(
            f"--eval_batches must be >= 0 (0: the whole validation split), got {args.eval_batches}"
        )
    if not 0.0 <= args.alpha <= 1.0:
        p.error(f"--alpha must be in [0, 1], got {args.alpha}")
    if args.temperature <= 0:
        p.error(f"--temperature must be > 0, got {args.temperature}")
    # What quality_batches.SeqioBatches and quality_training.learning_rate read.
    args.schedule, args.warmup_steps = "constant", 0
    return args


def fraction_kept(student, dense, teacher):
    """`(student - dense) / (teacher - dense)`; None when the teacher does not beat `dense`.

    >>> fraction_kept(-4.25, -4.5, -4.0)
    0.5
    >>> fraction_kept(-4.30, -4.20, -4.25) is None
    True
    """
    gain = teacher - dense
    return (student - dense) / gain if gain > 0 else None


def summarise(finals):
    """{name: per-seed finals} -> {name: {mean, std, per_seed}} with the fractions kept."""
    out = {
        name: {
            "mean": statistics.fmean(v),
            "per_seed": v,
            "std": statistics.stdev(v) if len(v) > 1 else None,
        }
        for name, v in finals.items()
    }
    mean = {name: s["mean"] for name, s in out.items()}
    n = len(finals["dense_baseline"])
    for control in ("dense_baseline", "dense_baseline_more_steps"):
        gains = [t - d for t, d in zip(finals["switch_teacher"], finals[control], strict=False)]
        kept = [
            fraction_kept(s, d, t)
            for s, d, t in zip(
                finals["distilled_student"], finals[control], finals["switch_teacher"], strict=False
            )
        ]
        out[f"vs_{control}"] = {
            "teacher_gain": statistics.fmean(gains),
            "teacher_gain_std_of_mean": statistics.stdev(gains) / n**0.5 if n > 1 else None,
            "student_gain": mean["distilled_student"] - mean[control],
            "fraction_kept": fraction_kept(
                mean["distilled_student"], mean[control], mean["switch_teacher"]
            ),
            "fraction_kept_per_seed": kept,
        }
    return out


def main(argv=None):
    args = parse_args(argv)
    import keras

    from benchmarks import common
    from keras_moe.distill import build_distiller
    from keras_moe.models import build_model, count_params

    command = quality_args.command_line("distill.py", argv)
    source = quality_batches.SeqioBatches(args)
    held_out, held_out_tokens = source.held_out()
    print(f"task {source.task}, held-out set: {held_out_tokens} target tokens", flush=True)
    dense_config = quality_models.base_dense_config(args, source.vocab_size)
    teacher_config = quality_models.sparse_config(dense_config, "switch", args.experts)

    def optimizer():
        return keras.optimizers.Adam(quality_training.learning_rate(args))

    def fit(model, seed, steps, name):
        # Every model of a seed sees the same batches in the same order from its first step.
        out = quality_training.train_with_curve(
            model, source.train(seed), held_out, steps, steps, f"{name} (seed {seed})"
        )
        return out["final_neg_log_perplexity"], out["train_seconds"]

    finals = {name: [] for name in MODELS}
    seconds = {name: 0.0 for name in MODELS}
    params = {}
    for seed in quality_args.seed_list(args):
        keras.utils.set_random_seed(seed)
        dense = build_model(dense_config)
        dense.compile(**dense.compile_defaults(optimizer=optimizer()))
        keras.utils.set_random_seed(seed)
        teacher = build_model(teacher_config)
        teacher.compile(**teacher.compile_defaults(optimizer=optimizer()))
        jobs = [
            ("dense_baseline", dense, args.steps),
            ("dense_baseline_more_steps", dense, args.student_steps),
            ("switch_teacher", teacher, args.steps),
        ]
        for name, model, steps in jobs:
            value, s = fit(model, seed, steps, name)
            finals[name].append(value)
            seconds[name] += s
        keras.utils.set_random_seed(seed)
        distiller = build_distiller(
            teacher=teacher,
            alpha=args.alpha,
            temperature=args.temperature,
            expert_init=args.expert_init,
        )
        distiller.compile(**distiller.compile_defaults(optimizer=optimizer()))
        value, s = fit(distiller, seed, args.student_steps, "distilled_student")
        finals["distilled_student"].append(value)
        seconds["distilled_student"] += s
        params = {
            "dense_baseline": count_params(dense_config),
            "switch_teacher": count_params(teacher_config),
            "distilled_student": count_params(distiller.student.config),
        }
        summary = summarise(finals)
        payload = {
            "benchmark": "distill",
            "command": command,
            "task": source.task,
            "task_fallback_reason": source.fallback_reason,
            "feature_lengths": source.lengths,
            "args": vars(args),
            "held_out_target_tokens": held_out_tokens,
            "seeds_done": len(finals["dense_baseline"]),
            "results": summary,
            "train_seconds": seconds,
            "params": params,
            "compression": 1.0 - params["distilled_student"] / params["switch_teacher"],
            "note": f"dense_baseline_more_steps: the baseline trained {args.student_steps} "
            "steps more, as many batches in all as the student (which starts from "
            "the teacher's non-expert weights)",
            "paper": "Switch Transformer Table 6: 29-37% of the gain kept at 82-99% compression",
            "environment": common.environment(),
        }
        path = common.write_result(args.output, payload)  # after each seed: a stop keeps it
    for name in MODELS:
        s = summary[name]
        std = "" if s["std"] is None else f" ± {s['std']:.4f}"
        print(f"{name:>26s}: {s['mean']:.4f}{std}", flush=True)
    for control in ("dense_baseline", "dense_baseline_more_steps"):
        c = summary[f"vs_{control}"]
        kept = (
            "n/a (the teacher does not beat it)"
            if c["fraction_kept"] is None
            else f"{100 * c['fraction_kept']:.0f}%"
        )
        print(
            f"against {control}: teacher gain {c['teacher_gain']:+.4f}, student gain "
            f"{c['student_gain']:+.4f}, kept {kept}",
            flush=True,
        )
    print(f"wrote {path}\ncommand: {command}", flush=True)
    return payload


if __name__ == "__main__":
    main()
