"""Quality at equal compute: dense T5.1.1 vs Switch-8/Switch-16 (Switch Transformer Fig. 1/Tab. 1).

In miniature, on real English (T5 prefix LM on the Debian Python/Perl docs):
a dense T5.1.1-style model (4+4 layers) and Switch models with 8 and 16
experts of the same FLOPs per token (each expert has the dense model's
d_model/d_ff, top-1 routing, an MoE FFN in every other layer) are trained for
the same steps (Adam at a constant rate, or warmup + cosine decay), on the same
batches in the same order, for 3 seeds. Every `--eval_every` steps each is scored on the whole
validation split (105k target tokens at the default lengths): negative log
perplexity = weighted mean log-probability of the target tokens (higher is
better). Reports, per model, the mean curve with each seed's values and std,
and the router health of every MoE layer; per Switch model, the gain over dense
in nats and in dense seed std, the step and the training time at which it
reaches the dense model's final value (`targets`: <= 1/2 of dense), and
whether each target is met; with `--table1`, top-1 (Switch) vs top-2 (GShard)
routing at capacity factors 1.0 / 1.25 / 2.0 (paper Table 1) with step times.
The JSON is rewritten after every model, so a stopped run keeps what it
measured.

    python benchmarks/quality.py --steps 800 --eval_every 100 --experts 8 \
        --output quality_constant                 # dense vs Switch-8, 3 seeds: ~1.5 h*
    python benchmarks/quality.py --steps 800 --eval_every 200 --schedule cosine \
        --experts 8 16                            # the cosine result (quality.json): ~2.5 h*
    python benchmarks/quality.py ... --retime     # wall-time figures of a result
    python benchmarks/quality.py ... --experts 8 16 --reuse
                                                  # trains only the models the result lacks
    python benchmarks/quality.py --table1         # + 6 Table 1 runs
    python benchmarks/quality.py --smoke          # about a minute; checks it runs

Where seqio and TensorFlow are missing (a JAX GPU host), train on saved batches:
`--export_batches DIR` (here) writes the exact training batches of every seed
and the held-out batches (20 MB for 5 seeds x 800 steps); then, there,
`KERAS_BACKEND=jax JAX_PLATFORMS=cuda python benchmarks/quality.py ... --batches
DIR --workers 12` trains the same models on them, 12 (model, seed) runs at a
time (step times then share the device: time them apart with `--retime`).

(*) on 2 shared cores: dense and Switch-8, 3 seeds each, 90-95 min; Switch-16's
3 seeds 50 min.

The docs task needs `apt-get install -y python3.11-doc perl-doc`; without the
Debian docs the embedded English corpus (`embedded_prefix_lm`) is used and the
JSON says so (`task`, `task_fallback_reason`).
"""

import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.quality_args import command_line, parse_args, seed_list
from benchmarks.quality_batches import FileBatches, SeqioBatches, export_batches
from benchmarks.quality_existing_result import retime, reusable_runs
from benchmarks.quality_models import base_dense_config, sparse_config
from benchmarks.quality_plot import plot
from benchmarks.quality_stats import TARGETS, compare, difference_with_noise, mean_over_seeds
from benchmarks.quality_training import interleaved_step_times, learning_rate, train_with_curve
from benchmarks.quality_workers import run_in_workers


def main(argv=None):
    args = parse_args(argv)
    import keras

    from benchmarks import common
    from keras_moe.models import build_model, count_params

    reused = reusable_runs(args.output, args) if args.reuse and not args.job else {}
    command = command_line("quality.py", argv)
    source = FileBatches(args) if args.batches else SeqioBatches(args)
    task, fallback_reason, lengths = source.task, source.fallback_reason, source.lengths
    seeds = seed_list(args)
    if args.export_batches:
        return export_batches(args, source)

    dense_config = base_dense_config(args, source.vocab_size)

    def moe_config(moe_type, experts, train_cf, eval_cf, dispatch="auto"):
        return sparse_config(
            dense_config.replace(track_router_metrics=True),
            moe_type,
            experts,
            train_capacity_factor=train_cf,
            eval_capacity_factor=eval_cf,
            min_expert_capacity=args.min_expert_capacity,
            dispatch=dispatch,
        )

    main_configs = (
        {}
        if args.no_main
        else {
            f"switch{e}": moe_config("switch", e, args.capacity_factor, args.eval_capacity_factor)
            for e in args.experts
        }
    )
    main_configs.update(
        {
            f"switch{e}_dropless": moe_config(
                "switch", e, args.capacity_factor, args.eval_capacity_factor, "dropless"
            )
            for e in args.dropless_experts
        }
    )
    table1_configs = (
        {}
        if not args.table1
        else {
            f"{router}_E{args.table1_experts}_cf{cf:g}": moe_config(
                moe_type, args.table1_experts, cf, cf
            )
            for cf in args.table1_cf
            for moe_type, router in (("switch", "top1"), ("gshard", "top2"))
        }
    )
    all_configs = {"dense": dense_config, **main_configs, **table1_configs}

    def run_one(name, seed):
        """One model trained from `seed`: its `train_with_curve` record."""
        keras.utils.set_random_seed(seed)  # same initialisation stream for every model
        model = build_model(all_configs[name])
        # On JAX an uncompiled step runs op by op; TensorFlow's default graph step is faster
        # than its XLA one at this size.
        model.compile(
            **model.compile_defaults(
                optimizer=keras.optimizers.Adam(learning_rate(args)),
                jit_compile=keras.backend.backend() == "jax",
            )
        )
        label = name if len(seeds) == 1 else f"{name} (seed {seed})"
        # Same seed -> same batches in the same order for every model.
        return train_with_curve(
            model,
            source.train(seed),
            source.held_out()[0],
            args.steps,
            args.eval_every,
            label,
            eval_batch_size=args.batch_size,
        )

    if args.job:  # a worker process of --workers
        import json

        name, seed = args.job.rsplit(":", 1)
        out = run_one(name, int(seed))
        with open(args.job_output, "w") as f:
            json.dump(out, f)
        return out

    step_times = None
    if args.timing_repeats:
        step_times = interleaved_step_times(
            all_configs, source.train(args.seed), args.timing_repeats
        )

    def time_ratio(name):
        return (
            None
            if step_times is None
            else (step_times[name]["median"] / step_times["dense"]["median"])
        )

    if args.retime:
        return retime(args.output, step_times, main_configs, table1_configs)

    held_out_tokens = source.held_out()[1]
    print(f"held-out set: {held_out_tokens} target tokens", flush=True)

    pending = {}
    if args.workers > 1:
        pending = run_in_workers(
            [(name, seed) for name in all_configs if name not in reused for seed in seeds],
            argv,
            args.workers,
        )

    def run(name, config):
        outs = [pending[name, seed].result() if pending else run_one(name, seed) for seed in seeds]
        out = mean_over_seeds(outs, seeds)
        spec = config.sparse_ffn
        out.update(
            params=count_params(config),
            num_experts=config.num_experts,
            moe_type=spec
            and {"keras_moe>SwitchFeedForward": "switch", "keras_moe>GShardFeedForward": "gshard"}[
                spec["class_name"]
            ],
            train_capacity_factor=config.sparse_option("train_capacity_factor"),
            eval_capacity_factor=config.sparse_option("eval_capacity_factor"),
        )
        return out

    start = time.time()

    def save(runs, comparison, table1, ordering=None, final=False, extra=None):
        """Writes the JSON after every run, so an interrupted run keeps what it measured."""
        payload = {
            "benchmark": "quality",
            "command": command,
            "task": task,
            "complete": final,
            "task_fallback_reason": fallback_reason,
            "feature_lengths": lengths,
            "args": vars(args),
            "held_out_target_tokens": held_out_tokens,
            "model": {
                k: v
                for k, v in dense_config.to_dict().items()
                if k
                in (
                    "vocab_size",
                    "d_model",
                    "num_heads",
                    "d_kv",
                    "d_ff",
                    "num_encoder_layers",
                    "num_decoder_layers",
                    "activation",
                    "init_scale",
                )
            },
            "optimizer": (
                f"Adam({args.learning_rate}), constant"
                if args.schedule == "constant"
                else f"Adam, linear warmup to {args.learning_rate} over "
                f"{args.warmup_steps} steps, cosine decay to 10% at step "
                f"{args.steps}"
            ),
            "seeds": seeds,
            "reused_runs": sorted(reused),
            "sparse_layers": "every other layer (encoder and decoder layers 1, 3, ...)",
            "runs": runs,
            "dense_final_neg_log_perplexity": runs["dense"]["final_neg_log_perplexity"],
            "comparison": comparison,
            "ordering_by_experts": ordering,
            "table1": table1,
            "targets": TARGETS,
            "interleaved_step_times": step_times,
            "total_seconds": time.time() - start,
            "environment": common.environment(),
            **(extra or {}),
        }
        return payload, common.write_result(args.output, payload)

    if reused:
        print("reusing " + ", ".join(reused) + f" from {args.output}.json", flush=True)

    def run_or_reuse(name, config):
        return reused[name] if name in reused else run(name, config)

    runs = {"dense": run_or_reuse("dense", dense_config)}
    dense_final = runs["dense"]["final_neg_log_perplexity"]
    comparison, ordering, dropless_vs_capacity = {}, None, {}
    save(runs, comparison, [])
    if not args.no_main:
        for name, config in main_configs.items():
            runs[name] = run_or_reuse(name, config)
            comparison[name] = compare(runs[name], runs["dense"], time_ratio(name))
            save(runs, comparison, [])
        names = [f"switch{e}" for e in sorted(args.experts)]
        ordering = [
            difference_with_noise(runs[b], runs[a])
            for a, b in zip(["dense"] + names, names, strict=False)
        ]
        for e in args.dropless_experts:  # dropless vs the capacity-factor layer, same E
            name, capped = f"switch{e}_dropless", f"switch{e}"
            if capped in runs:
                dropless_vs_capacity[name] = {
                    **difference_with_noise(runs[name], runs[capped]),
                    "step_time_ratio": time_ratio(name) / time_ratio(capped)
                    if step_times
                    else runs[name]["step_time_s"] / runs[capped]["step_time_s"],
                    "step_time_ratio_interleaved": step_times is not None,
                }

    table1 = []
    if args.table1:
        for name, config in table1_configs.items():
            r = run_or_reuse(name, config)
            runs[name] = r
            table1.append(
                {
                    "name": name,
                    "router": "top1" if name.startswith("top1") else "top2",
                    "num_experts": config.num_experts,
                    "capacity_factor": config.sparse_option("train_capacity_factor"),
                    "final_neg_log_perplexity": r["final_neg_log_perplexity"],
                    "gain_over_dense": r["final_neg_log_perplexity"] - dense_final,
                    "final_std": r["final_std"],
                    "step_time_s": r["step_time_s"],
                    "step_time_vs_dense": r["step_time_s"] / runs["dense"]["step_time_s"],
                    "step_time_vs_dense_interleaved": time_ratio(name),
                }
            )
            save(runs, comparison, table1)
    total = time.time() - start
    extra = {}
    if not args.no_plot:
        os.makedirs(common.RESULTS_DIR, exist_ok=True)
        png = os.path.join(common.RESULTS_DIR, f"{args.output}.png")
        main_runs = {k: v for k, v in runs.items() if k == "dense" or k.startswith("switch")}
        title = (
            f"{task}: d_model {args.d_model}, d_ff {args.d_ff}, {args.layers}+{args.layers} "
            f"layers, batch {args.batch_size}x{args.inputs}"
            + (f"\nmean of {len(seeds)} seeds (band: min-max)" if len(seeds) > 1 else "")
        )
        extra["plot"] = os.path.relpath(
            plot(main_runs, "dense", png, title), os.path.dirname(common.RESULTS_DIR)
        )
    if dropless_vs_capacity:
        extra["dropless_vs_capacity"] = dropless_vs_capacity
    payload, path = save(runs, comparison, table1, ordering, final=True, extra=extra)

    print(f"\ntask {task}; dense final neg log perplexity {dense_final:.4f} at step {args.steps}")
    for name, c in comparison.items():
        reach = (
            "never"
            if c["steps_to_dense_final"] is None
            else f"step {c['steps_to_dense_final']:.0f} ({100 * c['fraction_of_dense_steps']:.0f}% "
            "of the dense steps)"
        )
        noise = (
            ""
            if c["gain_in_dense_seed_std"] is None
            else f" = {c['gain_in_dense_seed_std']:+.1f} dense seed std"
        )
        print(
            f"{name}: final {runs[name]['final_neg_log_perplexity']:.4f} "
            f"(gain {c['final_gain_over_dense']:+.4f}{noise}); reaches dense final at {reach}"
            + (
                ""
                if c["fraction_of_dense_time"] is None
                else f", {100 * c['fraction_of_dense_time']:.0f}% of the dense training time"
            )
            + f"; step time x{c['step_time_vs_dense']:.2f} of dense; targets met: "
            + (", ".join(k for k, v in c["meets"].items() if v) or "none")
        )
    for o in ordering or []:
        print(
            f"ordering step: {o['difference']:+.4f} nats"
            + (
                ""
                if o["noise_std"] is None
                else f" (noise std {o['noise_std']:.4f}, resolved: {o['resolved']})"
            )
        )
    for name, d in dropless_vs_capacity.items():
        print(
            f"{name} - {name.replace('_dropless', '')}: {d['difference']:+.4f} nats"
            + (
                ""
                if d["noise_std"] is None
                else f" (noise std {d['noise_std']:.4f}, resolved: {d['resolved']})"
            )
            + f"; step time x{d['step_time_ratio']:.3f}"
        )
    for row in table1:
        print(
            f"{row['name']:>16s}: final {row['final_neg_log_perplexity']:.4f} "
            f"(gain {row['gain_over_dense']:+.4f}), step {1e3 * row['step_time_s']:.1f} ms "
            f"(x{row['step_time_vs_dense']:.2f} dense)"
        )
    print(f"total {total:.0f} s; wrote {path}\ncommand: {command}", flush=True)
    return payload


if __name__ == "__main__":
    main()
