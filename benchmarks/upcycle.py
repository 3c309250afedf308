"""Sparse upcycling measured: does a dense run continued as a MoE beat the dense run continued?

The models and data of `quality.py` / `recipes.py` (docs_prefix_lm, d_model 64,
4+4 layers, Adam 3e-3 constant, batch 16, seeds 0-2). Per seed, dense trains
`--dense_steps`; its weights and Adam state then start, for `--extra_steps`
more steps on the next batches of the same stream:
  * dense: the dense run continued;
  * switch8_upcycled: Switch-8 (top-1, gate = router probability) with every
    expert the layer's FFN, router fresh (Komatsuzaki et al.; it starts at
    the FFN times its gate, so not at the dense model);
  * fg32_top4_upcycled: 32 experts of d_ff/4, top-4 with renormalised gates
    (the fine-grained recipe), expert e the (e mod 4)-th slice of the FFN, the
    router's fresh scores replicated over each copy's 4 slices: it starts
    exactly at the dense model (`keras_moe.models.upcycle`).
Each continuation is scored on the whole held-out split every `--eval_every`
steps. Reports per arm the final value (mean ± std over seeds), the gain over
dense's continuation, the extra steps and wall-clock (steps × interleaved step
time ratio) to reach dense's final continuation value, and, from
`results/recipes_long.json` (the same batches from step 0), the steps the same
fine-grained MoE trained from scratch needs to reach that value.

    python benchmarks/upcycle.py                 # 3 seeds, 800 + 800 steps
    python benchmarks/upcycle.py --smoke         # about two minutes
"""

import argparse
import os
import sys
import tempfile
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

SCRATCH_RESULT = "recipes_long"
ARMS = ("dense", "switch8_upcycled", "fg32_top4_upcycled")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dense_steps", type=int, default=800)
    p.add_argument("--extra_steps", type=int, default=800)
    p.add_argument("--eval_every", type=int, default=200)
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--timing_repeats", type=int, default=20)
    p.add_argument("--output", default="upcycle")
    p.add_argument("--smoke", action="store_true")
    args = p.parse_args(argv)
    if args.smoke:
        base = quality_args.parse_args(["--smoke", "--seeds", "1"])
        args.dense_steps = args.extra_steps = args.eval_every = base.eval_every
        args.seeds, args.timing_repeats = 1, 2
        from benchmarks import common

        common.use_smoke_results()
    else:
        base = quality_args.parse_args(
            [
                "--steps",
                str(args.dense_steps),
                "--eval_every",
                str(args.eval_every),
                "--seeds",
                str(args.seeds),
                "--schedule",
                "constant",
            ]
        )
    return args, base


def arm_configs(dense_config):
    """{arm: (config, router_init)}; dense has no router."""
    import functools

    import keras_moe

    # recipes.py's fg32_top4, with its 4 gates renormalised to sum to 1.
    fg32 = dense_config.replace(
        track_router_metrics=True,
        encoder_sparse_step=2,
        decoder_sparse_step=2,
        sparse_ffn=functools.partial(
            keras_moe.TopKFeedForward,
            num_experts=32,
            d_ff=dense_config.d_ff // 4,
            k=4,
            normalize_top_k=True,
            activation=dense_config.activation,
            init_scale=dense_config.init_scale,
            train_capacity_factor=1.25,
            eval_capacity_factor=2.0,
            min_expert_capacity=4,
        ),
    )
    return {
        "dense": (dense_config, None),
        "switch8_upcycled": (quality_models.sparse_config(dense_config, "switch", 8), "fresh"),
        "fg32_top4_upcycled": (fg32, "replicated"),
    }


def continue_run(config, router_init, checkpoint, seed, learning_rate):
    """The model of `config` started from the dense checkpoint (weights, Adam state, step)."""
    import keras

    from keras_moe.models import build_model
    from keras_moe.training.checkpoint.checkpoint_config import CheckpointConfig
    from keras_moe.training.checkpoint.upcycle_checkpoint import Upcycle

    keras.utils.set_random_seed(seed + 1000)
    model = build_model(config)
    model.compile(**model.compile_defaults(optimizer=keras.optimizers.Adam(learning_rate)))
    if router_init is None:
        model.optimizer.build(model.trainable_variables)
        model.load_weights(checkpoint)
    else:
        with tempfile.TemporaryDirectory() as run_dir:
            CheckpointConfig(
                init_checkpoint=checkpoint, upcycle=Upcycle(router_init=router_init)
            ).check().restore(model, run_dir)
    return model


def scratch_steps(target):
    """Steps from 0 at which the scratch fine-grained run of `SCRATCH_RESULT` reaches
    `target` (its mean curve), or None when that result is missing or never does."""
    from benchmarks import common

    stored = common.read_result(SCRATCH_RESULT)
    run = (stored or {}).get("runs", {}).get("fg32_top4")
    if not run:
        return None
    return quality_stats.steps_to_reach(
        [(p["step"], p["neg_log_perplexity"]) for p in run["curve"]], target
    )


def main(argv=None):
    args, base = parse_args(argv)
    import keras

    from benchmarks import common
    from keras_moe.models import build_model, count_params

    source = quality_batches.SeqioBatches(base)
    seeds = quality_args.seed_list(base)
    dense_config = quality_models.base_dense_config(base, source.vocab_size)
    configs = arm_configs(dense_config)
    held_out = source.held_out()[0]
    step_times = quality_training.interleaved_step_times(
        {name: config for name, (config, _) in configs.items()},
        source.train(0),
        args.timing_repeats,
    )
    start, phase1, outs = time.time(), [], {arm: [] for arm in ARMS}

    def save(final=False):
        runs = {
            arm: quality_stats.mean_over_seeds(o, seeds[: len(o)]) for arm, o in outs.items() if o
        }
        for arm in runs:
            runs[arm]["params"] = count_params(configs[arm][0])
        rows = {}
        if "dense" in runs:
            dense = runs["dense"]
            for arm, run in runs.items():
                if arm == "dense":
                    continue
                ratio = step_times[arm]["median"] / step_times["dense"]["median"]
                rows[arm] = quality_stats.compare(run, dense, ratio)
                rows[arm]["start_neg_log_perplexity"] = run["curve"][0]["neg_log_perplexity"]
            target = dense["final_neg_log_perplexity"]
            reach = scratch_steps(target)
            rows["fg32_top4_from_scratch"] = {
                "source": f"results/{SCRATCH_RESULT}.json",
                "steps_to_dense_continuation_final": reach,
                "upcycled_total_steps_to_it": None
                if rows.get("fg32_top4_upcycled", {}).get("steps_to_dense_final") is None
                else args.dense_steps + rows["fg32_top4_upcycled"]["steps_to_dense_final"],
            }
        return common.write_result(
            args.output,
            {
                "benchmark": "upcycle",
                "command": quality_args.command_line("upcycle.py", argv),
                "complete": final,
                "task": source.task,
                "args": vars(args),
                "seeds": seeds,
                "held_out_target_tokens": source.held_out()[1],
                "dense_phase": quality_stats.mean_over_seeds(phase1, seeds[: len(phase1)])
                if phase1
                else None,
                "interleaved_step_times": step_times,
                "runs": runs,
                "rows": rows,
                "total_seconds": time.time() - start,
                "environment": common.environment(),
            },
        )

    for seed in seeds:
        keras.utils.set_random_seed(seed)
        dense = build_model(dense_config)
        dense.compile(**dense.compile_defaults(optimizer=keras.optimizers.Adam(base.learning_rate)))
        out = quality_training.train_with_curve(
            dense,
            source.train(seed),
            held_out,
            args.dense_steps,
            args.eval_every,
            f"dense phase (seed {seed})",
        )
        out["seed"] = seed
        phase1.append(out)
        with tempfile.TemporaryDirectory() as folder:
            checkpoint = os.path.join(folder, "dense.weights.h5")
            dense.save_weights(checkpoint)
            for arm, (config, router_init) in configs.items():
                model = continue_run(config, router_init, checkpoint, seed, base.learning_rate)
                stream = source.train(seed).skip(args.dense_steps)  # the next batches
                out = quality_training.train_with_curve(
                    model,
                    stream,
                    held_out,
                    args.extra_steps,
                    args.eval_every,
                    f"{arm} (seed {seed})",
                )
                out["seed"] = seed
                outs[arm].append(out)
                save()
    path = save(final=True)
    result = common.read_result(args.output)
    for arm, row in result["rows"].items():
        print(
            arm,
            {
                k: v
                for k, v in row.items()
                if k
                in (
                    "final_gain_over_dense",
                    "gain_in_dense_seed_std",
                    "steps_to_dense_final",
                    "fraction_of_dense_time",
                    "start_neg_log_perplexity",
                    "steps_to_dense_continuation_final",
                    "upcycled_total_steps_to_it",
                )
            },
        )
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
