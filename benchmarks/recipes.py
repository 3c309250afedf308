"""Today's MoE recipe at equal active compute: fine-grained, shared experts, balancing.

The models of `quality.py` (docs_prefix_lm, d_model 64, 4+4 layers, an MoE FFN
in every other layer, Adam 3e-3 constant, 800 steps of batch 16, seeds 0-2),
with the fine-grained sparse layers of DeepSeek-MoE / OLMoE instead of
Switch-8: 32 experts of a quarter of the dense d_ff, top-4 (the dense FFN's
FLOPs per token), then top-3 beside one shared quarter-width expert (same
FLOPs), then loss-free bias balancing instead of the auxiliary loss, and the
sequence-wise and global-batch balance losses. Dense and Switch-8 are read
from `results/quality_constant.json` (the same batches per seed, the same
held-out split); each recipe is trained here and scored on the whole
validation split every `--eval_every` steps. A collapse-prone setting (no
balance loss, no bias) is trained beside the same with loss-free balancing.

Reports per recipe the final held-out neg log perplexity (mean ± std over
seeds), the gain over dense (nats, dense seed std) against Switch-8's, the
step and the training time at which it reaches dense's final value (step
times timed interleaved with dense in this run), and MaxVio per MoE layer
(max expert load over the mean, minus 1; training batch, last epoch).

    python benchmarks/recipes.py                       # every recipe, 3 seeds
    python benchmarks/recipes.py --recipes fg32_top4 --seeds 1 --reuse
    python benchmarks/recipes.py --smoke               # about a minute
    python benchmarks/recipes.py --recipes fg32_top4 --steps 3200 --eval_every 400 \
        --output recipes_long                          # 4x the length, dense trained here

At a run length other than the stored baseline's, dense is trained here on the
same seeds and batches (and Switch-8 too with `--switch8`); without Switch-8
the rows leave out the gain ratio to it.

The JSON (`results/recipes.json`) is rewritten after every (recipe, seed), and
`--reuse` keeps the (recipe, seed) runs it already holds.
"""

import argparse
import os
import statistics
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks import (
    quality_args,
    quality_batches,
    quality_models,
    quality_stats,
    quality_training,
)

# name -> (TopKFeedForward arguments beyond the quarter-width experts, what it is)
RECIPES = {
    "fg32_top4": (dict(k=4), "32 experts of d_ff/4, top-4, group balance loss"),
    "fg32_top3_shared1": (
        dict(k=3, shared=True),
        "32 experts of d_ff/4, top-3 + 1 shared expert of d_ff/4",
    ),
    "fg32_top3_shared1_lossfree": (
        dict(k=3, shared=True, selection_bias=True, bias_update_rate=1e-3, aux_loss_factor=0.0),
        "... + loss-free bias balancing (rate 1e-3), no balance loss",
    ),
    "fg32_top4_sequence_loss": (
        dict(k=4, balance_loss="sequence"),
        "fg32_top4 with DeepSeek's sequence-wise balance loss",
    ),
    "fg32_top4_global_loss": (
        dict(k=4, balance_loss="global"),
        "fg32_top4 with the global-batch balance loss",
    ),
    "fg32_top4_no_balance": (
        dict(k=4, aux_loss_factor=0.0),
        "collapse-prone: no balance loss, no bias",
    ),
    "fg32_top4_no_balance_lossfree": (
        dict(k=4, aux_loss_factor=0.0, selection_bias=True, bias_update_rate=1e-3),
        "the same + loss-free bias balancing",
    ),
}
BASELINE_RESULT = "quality_constant"


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--recipes", nargs="+", default=list(RECIPES), choices=list(RECIPES))
    p.add_argument("--experts", type=int, default=32)
    p.add_argument(
        "--width_divisor",
        type=int,
        default=4,
        help="each expert's d_ff is the dense d_ff over this",
    )
    p.add_argument("--steps", type=int, default=800)
    p.add_argument("--eval_every", type=int, default=200)
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--timing_repeats", type=int, default=20)
    p.add_argument("--reuse", action="store_true")
    p.add_argument("--output", default="recipes")
    p.add_argument("--smoke", action="store_true")
    p.add_argument(
        "--switch8",
        action="store_true",
        help="when dense is trained here (another run length), train Switch-8 too",
    )
    args = p.parse_args(argv)
    if args.smoke:
        base = quality_args.parse_args(["--smoke", "--seeds", "1"])
        args.experts, args.timing_repeats, args.seeds = 8, 2, 1
        args.steps, args.eval_every = base.steps, base.eval_every
        args.output = "recipes_smoke"
    else:
        base = quality_args.parse_args(
            [
                "--steps",
                str(args.steps),
                "--eval_every",
                str(args.eval_every),
                "--seeds",
                str(args.seeds),
                "--schedule",
                "constant",
            ]
        )
    return args, base


def recipe_config(dense_config, args, recipe):
    """`dense_config` with the recipe's `TopKFeedForward` in every other layer."""
    import functools

    import keras_moe

    layer_args = dict(RECIPES[recipe][0])
    d_ff = dense_config.d_ff // args.width_divisor
    if layer_args.pop("shared", False):
        layer_args["shared_d_ff"] = d_ff
    return dense_config.replace(
        track_router_metrics=True,
        encoder_sparse_step=2,
        decoder_sparse_step=2,
        sparse_ffn=functools.partial(
            keras_moe.TopKFeedForward,
            num_experts=args.experts,
            d_ff=d_ff,
            activation=dense_config.activation,
            init_scale=dense_config.init_scale,
            train_capacity_factor=1.25,
            eval_capacity_factor=2.0,
            min_expert_capacity=4,
            **layer_args,
        ),
    )


def max_violation(router_stats):
    """MaxVio of each MoE layer from a run's last-epoch router statistics (training batches)."""
    return {
        key.rsplit("/", 1)[0]: value
        for key, value in router_stats.items()
        if key.endswith("/max_violation") and not key.startswith("val_")
    }


def summarize(name, run, dense, switch8, step_time_ratio):
    """The recipe's row: final value, gains, steps and time to dense's final, MaxVio."""
    row = quality_stats.compare(run, dense, step_time_ratio)
    if switch8 is not None:
        switch_gain = switch8["final_neg_log_perplexity"] - dense["final_neg_log_perplexity"]
        row.update(
            gain_vs_switch8_gain=row["final_gain_over_dense"] / switch_gain,
            vs_switch8=quality_stats.difference_with_noise(run, switch8),
        )
    row.update(
        description=RECIPES[name][1],
        final_neg_log_perplexity=run["final_neg_log_perplexity"],
        final_std=run["final_std"],
        final_per_seed=run["final_per_seed"],
        max_violation_per_seed=[max_violation(o["router"]) for o in run["per_seed"]],
    )
    per_seed_mean = [statistics.fmean(v.values()) for v in row["max_violation_per_seed"] if v]
    row["max_violation_mean"] = statistics.fmean(per_seed_mean) if per_seed_mean else None
    row["max_violation_worst_layer"] = max(
        (max(v.values()) for v in row["max_violation_per_seed"] if v), default=None
    )
    return row


def main(argv=None):
    args, base = parse_args(argv)
    import keras

    from benchmarks import common
    from keras_moe.models import build_model, count_params

    baseline = common.read_result(BASELINE_RESULT) if not args.smoke else None
    source = quality_batches.SeqioBatches(base)
    seeds = quality_args.seed_list(base)
    dense_config = quality_models.base_dense_config(base, source.vocab_size)
    configs = {name: recipe_config(dense_config, args, name) for name in args.recipes}
    previous = common.read_result(args.output) if args.reuse else None
    stored_runs = (
        {}
        if previous is None
        else {
            **{k: v for k, v in (previous.get("references") or {}).items() if v},
            **previous.get("runs", {}),
        }
    )
    done = {
        (name, o["seed"]): o for name, run in stored_runs.items() for o in run.get("per_seed", [])
    }

    def train(config, seed, label):
        """One model of `config` trained from `seed` (the same batches per seed)."""
        keras.utils.set_random_seed(seed)
        model = build_model(config)
        model.compile(**model.compile_defaults(optimizer=keras.optimizers.Adam(base.learning_rate)))
        out = quality_training.train_with_curve(
            model,
            source.train(seed),
            source.held_out()[0],
            args.steps,
            args.eval_every,
            f"{label} (seed {seed})",
        )
        out["seed"] = seed
        return out

    def run_one(name, seed):
        return train(configs[name], seed, name)

    if baseline is not None and baseline["args"]["steps"] != args.steps:
        baseline = None  # another run length: the references are trained here
    trained_references = {}
    if baseline is None:

        def reference(config, label):
            outs = []
            for seed in seeds:  # each seed kept (`--reuse`) as soon as it is trained
                outs.append(done.get((label, seed)) or train(config, seed, label))
                trained_references[label] = quality_stats.mean_over_seeds(outs, seeds[: len(outs)])
                common.write_result(
                    args.output,
                    {
                        "benchmark": "recipes",
                        "complete": False,
                        "args": vars(args),
                        "references": trained_references,
                        "runs": previous.get("runs", {}) if previous else {},
                    },
                )
            return trained_references[label]

        dense = reference(dense_config, "dense")
        switch8 = (
            reference(quality_models.sparse_config(dense_config, "switch", 4), "switch8")
            if args.smoke or args.switch8
            else None
        )
    else:
        dense, switch8 = baseline["runs"]["dense"], baseline["runs"]["switch8"]
    timing_configs = {"dense": dense_config, **configs}
    step_times = (
        quality_training.interleaved_step_times(
            timing_configs, source.train(0), args.timing_repeats
        )
        if args.timing_repeats
        else None
    )
    start, runs, rows = time.time(), {}, {}
    if previous is not None:  # --reuse: the recipes not trained now stay in the result
        runs.update({k: v for k, v in previous.get("runs", {}).items() if k not in configs})
        rows.update({k: v for k, v in previous.get("rows", {}).items() if k not in configs})

    def save(final=False):
        payload = {
            "benchmark": "recipes",
            "command": quality_args.command_line("recipes.py", argv),
            "complete": final,
            "task": source.task,
            "args": vars(args),
            "baseline": BASELINE_RESULT,
            "seeds": seeds,
            "held_out_target_tokens": source.held_out()[1],
            "dense_final_neg_log_perplexity": dense["final_neg_log_perplexity"],
            "dense_final_std": dense["final_std"],
            "references": {"dense": dense, "switch8": switch8} if baseline is None else None,
            "switch8_final_neg_log_perplexity": switch8 and switch8["final_neg_log_perplexity"],
            "switch8_final_std": switch8 and switch8["final_std"],
            "interleaved_step_times": step_times,
            "runs": runs,
            "rows": rows,
            "total_seconds": time.time() - start,
            "environment": common.environment(),
        }
        return common.write_result(args.output, payload)

    for name in args.recipes:
        outs = []
        for seed in seeds:
            outs.append(done.get((name, seed)) or run_one(name, seed))
            runs[name] = quality_stats.mean_over_seeds(outs, seeds[: len(outs)])
            runs[name]["params"] = count_params(configs[name])
            ratio = (
                None
                if step_times is None
                else (step_times[name]["median"] / step_times["dense"]["median"])
            )
            rows[name] = summarize(name, runs[name], dense, switch8, ratio)
            save()
    path = save(final=True)
    print(
        f"\ndense {dense['final_neg_log_perplexity']:.4f}"
        + ("" if switch8 is None else f", Switch-8 {switch8['final_neg_log_perplexity']:.4f}")
    )
    for name, row in rows.items():
        std = "" if row["final_std"] is None else f" ± {row['final_std']:.4f}"
        print(
            f"{name:>30s}: {row['final_neg_log_perplexity']:.4f}{std}, gain "
            f"{row['final_gain_over_dense']:+.4f}"
            + (
                f" ({row['gain_vs_switch8_gain']:.2f}x Switch-8's)"
                if "gain_vs_switch8_gain" in row
                else ""
            )
            + f", MaxVio {row['max_violation_mean']}"
        )
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
