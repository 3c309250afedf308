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

import argparse
import os
import shlex
import statistics
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

FALLBACK_TASK = "embedded_prefix_lm"
DOCS_HINT = "apt-get update && apt-get install -y python3.11-doc perl-doc"


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--task",
        default="docs_prefix_lm",
        help=f"T5 pre-training task; falls back to {FALLBACK_TASK} if its data is missing",
    )
    p.add_argument("--inputs", type=int, default=64, help="encoder length")
    p.add_argument(
        "--targets",
        type=int,
        default=None,
        help="decoder length (default: --inputs for a prefix-LM task, "
        "tasks.span_corruption_targets_length(inputs) for span corruption)",
    )
    p.add_argument("--batch_size", type=int, default=16)
    p.add_argument("--steps", type=int, default=1000, help="training steps of every model")
    p.add_argument("--eval_every", type=int, default=100, help="steps between evaluations")
    p.add_argument(
        "--eval_batches",
        type=int,
        default=0,
        help="held-out batches per evaluation (0: the whole validation split; "
        "docs_prefix_lm at 64/64 has 202 batches of 16, 105k target tokens)",
    )
    p.add_argument("--d_model", type=int, default=64)
    p.add_argument("--d_ff", type=int, default=128, help="dense FFN and each expert's hidden size")
    p.add_argument("--num_heads", type=int, default=4)
    p.add_argument(
        "--layers",
        type=int,
        default=4,
        help="encoder and decoder layers each (MoE FFN in every other one)",
    )
    p.add_argument("--activation", default="gated-gelu", help="FFN activation (T5.1.1: gated-gelu)")
    p.add_argument(
        "--experts",
        type=int,
        nargs="+",
        default=[8, 16],
        help="expert counts of the Switch models of the main comparison",
    )
    p.add_argument(
        "--capacity_factor",
        type=float,
        default=1.25,
        help="training capacity factor of the main comparison",
    )
    p.add_argument(
        "--eval_capacity_factor",
        type=float,
        default=2.0,
        help="evaluation capacity factor of the main comparison",
    )
    p.add_argument("--min_expert_capacity", type=int, default=4)
    p.add_argument("--learning_rate", type=float, default=3e-3, help="Adam peak learning rate")
    p.add_argument(
        "--schedule",
        choices=("constant", "cosine"),
        default="constant",
        help="constant: the peak rate throughout (it trains every model of this "
        "size furthest in 800 steps); cosine: linear warmup over "
        "--warmup_steps, then cosine decay to 10%% of the peak at the last step",
    )
    p.add_argument(
        "--warmup_steps",
        type=int,
        default=None,
        help="warmup steps of the cosine schedule (default: 10%% of --steps)",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--seeds",
        type=int,
        default=3,
        help="train every model with this many seeds (--seed, --seed+1, ...: "
        "initialisation and data order) and report the mean curve and the "
        "spread; differences smaller than the spread are noise",
    )
    p.add_argument(
        "--dropless_experts",
        type=int,
        nargs="*",
        default=[],
        help="also train Switch-E with dispatch='dropless' (no capacity, nothing "
        "dropped) for these E, compared with the capacity-factor Switch-E",
    )
    p.add_argument("--no_main", action="store_true", help="skip the dense vs Switch-E comparison")
    p.add_argument(
        "--table1",
        action="store_true",
        help="also run top-1 vs top-2 at the capacity factors of --table1_cf",
    )
    p.add_argument("--table1_experts", type=int, default=8)
    p.add_argument(
        "--table1_cf",
        type=float,
        nargs="+",
        default=[1.0, 1.25, 2.0],
        help="capacity factors of the Table 1 runs (training and evaluation)",
    )
    p.add_argument(
        "--timing_repeats",
        type=int,
        default=20,
        help="training steps per model timed interleaved (one batch, every model "
        "in turn) for the wall-time comparison; 0: use the runs' own clocks",
    )
    p.add_argument(
        "--retime",
        action="store_true",
        help="train nothing: time the models of the existing result --output "
        "interleaved (with the same size arguments it was run with) and "
        "recompute its wall-time comparison; for a result whose runs met "
        "different machine load",
    )
    p.add_argument(
        "--reuse",
        action="store_true",
        help="keep the runs of the existing result --output (its models trained "
        "with the same training arguments) and train only the models it "
        "lacks, e.g. add --experts 8 16 to a dense + Switch-8 result",
    )
    p.add_argument("--output", default="quality", help="result name under benchmarks/results/")
    p.add_argument("--no_plot", action="store_true")
    p.add_argument(
        "--export_batches",
        metavar="DIR",
        default=None,
        help="write the training batches of every seed and the held-out batches "
        "as NumPy files under DIR, then stop (see --batches)",
    )
    p.add_argument(
        "--batches",
        metavar="DIR",
        default=None,
        help="train on the batches --export_batches wrote instead of seqio: needs "
        "neither seqio nor TensorFlow (e.g. KERAS_BACKEND=jax on a GPU host)",
    )
    p.add_argument(
        "--workers",
        type=int,
        default=1,
        help="train the (model, seed) runs in this many processes at once; their "
        "step times then share the machine",
    )
    p.add_argument("--job", default=None, help=argparse.SUPPRESS)  # NAME:SEED, in a worker
    p.add_argument("--job_output", default=None, help=argparse.SUPPRESS)
    p.add_argument("--smoke", action="store_true", help="tiny sizes, for tests")
    args = p.parse_args(argv)
    if args.smoke:  # tiny defaults; arguments given explicitly still win
        from benchmarks.common import use_smoke_results

        use_smoke_results()  # results/smoke/, not the committed files
        p.set_defaults(
            inputs=32,
            batch_size=2,
            steps=4,
            eval_every=2,
            eval_batches=1,
            d_model=16,
            d_ff=32,
            num_heads=2,
            layers=2,
            experts=[2],
            table1_experts=2,
            table1_cf=[1.0, 2.0],
            timing_repeats=2,
            task=FALLBACK_TASK,
        )  # no dependency on the Debian docs in tests
        args = p.parse_args(argv)
    if args.steps < 1 or args.eval_every < 1 or args.seeds < 1:
        p.error("--steps, --eval_every and --seeds must be >= 1")
    if args.eval_batches < 0:
        p.error(
            f"--eval_batches must be >= 0 (0: the whole validation split), got {args.eval_batches}"
        )
    if args.warmup_steps is None:
        args.warmup_steps = args.steps // 10
    if not 0 <= args.warmup_steps < args.steps:
        p.error(f"--warmup_steps must be in [0, --steps), got {args.warmup_steps}")
    if args.steps % args.eval_every:
        p.error(f"--steps ({args.steps}) must be a multiple of --eval_every ({args.eval_every})")
    if args.retime and args.reuse:
        p.error("--retime and --reuse exclude each other: --retime trains nothing")
    if args.retime and not args.timing_repeats:
        p.error("--retime needs --timing_repeats >= 1")
    if args.no_main and args.dropless_experts:
        p.error("--dropless_experts compares with the main Switch models: drop --no_main")
    if not set(args.dropless_experts) <= set(args.experts):
        p.error(
            f"--dropless_experts {args.dropless_experts} must be among --experts "
            f"{args.experts} (each is compared with the capacity-factor model)"
        )
    if args.no_main and not args.table1:
        p.error("--no_main without --table1 leaves nothing to run")
    if args.workers < 1:
        p.error(f"--workers must be >= 1, got {args.workers}")
    if args.export_batches and args.batches:
        p.error("--export_batches and --batches exclude each other")
    if (args.job is None) != (args.job_output is None):
        p.error("--job and --job_output go together")
    return args


def seed_list(args):
    """The seeds of the runs: --seed, --seed + 1, ... (--seeds of them)."""
    return [args.seed + i for i in range(args.seeds)]


def quiet_logs():
    """Hides seqio's "uncached FunctionDataset" and tf.function retracing warnings
    (each model is traced once; the data sources are small in-memory ones)."""
    import tensorflow as tf
    from absl import logging

    logging.set_verbosity(logging.ERROR)
    tf.get_logger().setLevel("ERROR")


# ---------------------------------------------------------------------------
# Pieces shared with benchmarks/translation.py
# ---------------------------------------------------------------------------


def pick_task(name, fallback, lengths):
    """`name` if its validation split yields a batch, else `fallback` (with the reason)."""
    from keras_moe import tasks
    from keras_moe.training.errors import TrainingConfigError
    from keras_moe.training.run import input_pipeline as data_lib

    try:
        data_lib.check_not_empty(
            data_lib.make_dataset(name, lengths, "validation", 1, repeat=False), name, "validation"
        )
        return name, None
    except (TrainingConfigError, tasks.SourceMissingError) as e:
        hint = f" (install with: {DOCS_HINT})" if name.startswith("docs_") else ""
        reason = f"task {name!r} unavailable: {e}{hint}"
        print(f"WARNING: {reason}\nWARNING: falling back to {fallback!r}", flush=True)
        return fallback, reason


def steps_to_reach(curve, target):
    """First step at which `curve` (list of (step, value), higher is better)
    reaches `target`, interpolating linearly between eval points; None if never.

    >>> steps_to_reach([(0, -9.0), (100, -5.0), (200, -3.0)], -4.0)
    150.0
    """
    previous = None
    for step, value in curve:
        if value >= target:
            if previous is None or previous[1] >= target:
                return float(step)
            (s0, v0), (s1, v1) = previous, (step, value)
            return float(s0 + (target - v0) * (s1 - s0) / (v1 - v0))
        previous = (step, value)
    return None


def make_step_timer():
    import keras

    class StepTimer(keras.callbacks.Callback):
        """Wall time of every training step (data fetch included)."""

        def __init__(self):
            super().__init__()
            self.times = []
            self._start = None

        def on_train_batch_begin(self, batch, logs=None):
            self._start = time.perf_counter()

        def on_train_batch_end(self, batch, logs=None):
            self.times.append(time.perf_counter() - self._start)

        def median(self, skip=1):
            """Median step time, leaving out the first `skip` steps (tracing)."""
            values = self.times[skip:] or self.times
            return statistics.median(values) if values else None

    return StepTimer()


def train_with_curve(model, train_ds, held_out, steps, eval_every, name="", eval_batch_size=None):
    """`model.fit` for `steps` steps (epochs of `eval_every` steps on one
    iterator of the infinite `train_ds`), evaluating on `held_out` at step 0
    and at the end of each epoch (Keras `validation_data`). `held_out` is a
    finite dataset of batches, or one `(x, y, w)` triple of arrays that Keras
    splits into batches of `eval_batch_size`.

    Returns dict with `curve` [{step, seconds, neg_log_perplexity, accuracy,
    loss}] (`seconds`: training wall time up to that step, evaluation left
    out), `train_loss` (per epoch), `step_time_s` (median), `train_seconds`,
    and `router` (the last epoch's router statistics of every MoE layer,
    training and held-out, when the model tracks them).
    """
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if isinstance(held_out, tuple):
            x, y, w = held_out
            first = model.evaluate(
                x, y, sample_weight=w, batch_size=eval_batch_size, verbose=0, return_dict=True
            )
        else:
            first = model.evaluate(held_out, verbose=0, return_dict=True)
        timer = make_step_timer()
        start = time.time()
        history = model.fit(
            train_ds,
            steps_per_epoch=eval_every,
            epochs=steps // eval_every,
            validation_data=held_out,
            validation_batch_size=eval_batch_size,
            callbacks=[timer],
            verbose=0,
        )
        seconds = time.time() - start
    h = history.history
    curve = [
        {
            "step": 0,
            "seconds": 0.0,
            "neg_log_perplexity": float(first["neg_log_perplexity"]),
            "accuracy": float(first["accuracy"]),
            "loss": float(first["loss"]),
        }
    ]
    for i in range(len(h["val_loss"])):
        curve.append(
            {
                "step": (i + 1) * eval_every,
                "seconds": float(sum(timer.times[: (i + 1) * eval_every])),
                "neg_log_perplexity": float(h["val_neg_log_perplexity"][i]),
                "accuracy": float(h["val_accuracy"][i]),
                "loss": float(h["val_loss"][i]),
            }
        )
    out = {
        "curve": curve,
        "final_neg_log_perplexity": curve[-1]["neg_log_perplexity"],
        "final_accuracy": curve[-1]["accuracy"],
        "train_loss": [float(v) for v in h["loss"]],
        "step_time_s": timer.median(skip=min(5, max(len(timer.times) - 1, 0))),
        "train_seconds": seconds,
        "router": {key: float(values[-1]) for key, values in h.items() if "/" in key},
    }
    points = " ".join(f"{p['step']}:{p['neg_log_perplexity']:.3f}" for p in curve)
    print(
        f"{name:>22s}: nlp {points} | step {1e3 * out['step_time_s']:.1f} ms, {seconds:.0f} s",
        flush=True,
    )
    return out


def mean_over_seeds(outs, seeds):
    """One run's record from the `train_with_curve` records of several seeds:
    the mean curve, the mean final value with its per-seed values and standard
    deviation, and the median step time; per-seed curves under `per_seed`."""
    curve = []
    for points in zip(*(o["curve"] for o in outs), strict=False):
        curve.append(
            {
                "step": points[0]["step"],
                **{
                    key: statistics.fmean(p[key] for p in points)
                    for key in ("seconds", "neg_log_perplexity", "accuracy", "loss")
                },
            }
        )
    finals = [o["final_neg_log_perplexity"] for o in outs]
    return {
        "curve": curve,
        "final_neg_log_perplexity": curve[-1]["neg_log_perplexity"],
        "final_accuracy": curve[-1]["accuracy"],
        "seeds": list(seeds),
        "final_per_seed": finals,
        "final_std": statistics.stdev(finals) if len(finals) > 1 else None,
        "step_time_s": statistics.median(o["step_time_s"] for o in outs),
        "train_seconds": sum(o["train_seconds"] for o in outs),
        "per_seed": outs,
    }


def gain_in_seed_std(moe_run, dense_run):
    """The final gain over dense in units of the dense model's seed-to-seed std
    (None with a single seed)."""
    std = dense_run["final_std"]
    gain = moe_run["final_neg_log_perplexity"] - dense_run["final_neg_log_perplexity"]
    return gain / std if std else None


TARGETS = {
    "gain": "each Switch model's final held-out neg log perplexity exceeds dense by >= 0.05 "
    "nats and by >= 5 dense seed std",
    "half_steps": "each Switch model reaches the dense model's final value in <= 1/2 of the "
    "dense model's steps",
    "half_wall_clock": "... and in <= 1/2 of the dense model's training wall time",
    "ordering": "more experts is better: Switch-16 >= Switch-8 >= dense",
}


def difference_with_noise(better, worse):
    """`better` minus `worse` (final neg log perplexity, seed means) with the
    std of that difference (from each run's seed std) and whether it exceeds
    twice that std; `resolved` is None with a single seed."""
    diff = better["final_neg_log_perplexity"] - worse["final_neg_log_perplexity"]
    n = len(better["final_per_seed"])
    if better["final_std"] is None or worse["final_std"] is None:
        return {"difference": diff, "noise_std": None, "resolved": None}
    noise = ((better["final_std"] ** 2 + worse["final_std"] ** 2) / n) ** 0.5
    return {"difference": diff, "noise_std": noise, "resolved": diff > 2 * noise}


def compare(moe_run, dense_run, step_time_ratio=None):
    """How a sparse run does against the dense one, in steps, wall time and final value.

    The wall-time target is judged on `step_time_ratio` (sparse over dense step
    time, timed interleaved in one stretch, so machine load hits both alike)
    times the fraction of steps, when given; else on the runs' own clocks.

    >>> dense = {"curve": [{"step": 0, "seconds": 0.0, "neg_log_perplexity": -9.0},
    ...                    {"step": 100, "seconds": 50.0, "neg_log_perplexity": -4.0}],
    ...          "final_neg_log_perplexity": -4.0, "final_std": 0.01, "step_time_s": 0.5}
    >>> moe = {"curve": [{"step": 0, "seconds": 0.0, "neg_log_perplexity": -9.0},
    ...                  {"step": 50, "seconds": 30.0, "neg_log_perplexity": -4.0},
    ...                  {"step": 100, "seconds": 60.0, "neg_log_perplexity": -3.5}],
    ...        "final_neg_log_perplexity": -3.5, "step_time_s": 0.6}
    >>> c = compare(moe, dense)
    >>> c["fraction_of_dense_steps"], c["fraction_of_dense_seconds"], c["meets"]
    (0.5, 0.6, {'gain': True, 'half_steps': True, 'half_wall_clock': False})
    """
    dense_final = dense_run["final_neg_log_perplexity"]
    dense_steps = dense_run["curve"][-1]["step"]
    dense_seconds = dense_run["curve"][-1]["seconds"]
    reach = steps_to_reach(
        [(p["step"], p["neg_log_perplexity"]) for p in moe_run["curve"]], dense_final
    )
    reach_s = steps_to_reach(
        [(p["seconds"], p["neg_log_perplexity"]) for p in moe_run["curve"]], dense_final
    )
    gain = moe_run["final_neg_log_perplexity"] - dense_final
    in_std = gain_in_seed_std(moe_run, dense_run)
    time_fraction = None if reach_s is None else reach_s / dense_seconds
    if step_time_ratio is not None:
        time_fraction = None if reach is None else reach / dense_steps * step_time_ratio
    return {
        "steps_to_dense_final": reach,
        "fraction_of_dense_steps": None if reach is None else reach / dense_steps,
        "seconds_to_dense_final": reach_s,
        "fraction_of_dense_seconds": None if reach_s is None else reach_s / dense_seconds,
        "final_gain_over_dense": gain,
        "gain_in_dense_seed_std": in_std,
        "step_time_vs_dense": moe_run["step_time_s"] / dense_run["step_time_s"],
        "step_time_vs_dense_interleaved": step_time_ratio,
        "fraction_of_dense_time": time_fraction,
        "meets": {
            "gain": gain >= 0.05 and in_std is not None and in_std >= 5,
            "half_steps": reach is not None and reach <= 0.5 * dense_steps,
            "half_wall_clock": time_fraction is not None and time_fraction <= 0.5,
        },
    }


def base_dense_config(args, vocab_size):
    """The benchmark's dense T5.1.1 model: `args.d_model`, heads, `d_ff`, `layers`
    encoder and decoder layers, `activation`, no dropout."""
    from keras_moe.models import T5Config

    return T5Config(
        vocab_size=vocab_size,
        d_model=args.d_model,
        num_heads=args.num_heads,
        d_kv=args.d_model // args.num_heads,
        d_ff=args.d_ff,
        num_encoder_layers=args.layers,
        num_decoder_layers=args.layers,
        activation=args.activation,
        dropout_rate=0.0,
    )


def sparse_config(dense_config, moe_type, num_experts, **layer_args):
    """`dense_config` with a Switch ("switch") or GShard ("gshard") layer of
    `num_experts` experts, of the dense FFN's size and activation, in every
    other encoder and decoder layer; `layer_args` go to the MoE layer."""
    import functools

    import keras_moe

    layer = {"switch": keras_moe.SwitchFeedForward, "gshard": keras_moe.GShardFeedForward}[moe_type]
    return dense_config.replace(
        encoder_sparse_step=2,
        decoder_sparse_step=2,
        sparse_ffn=functools.partial(
            layer,
            num_experts=num_experts,
            d_ff=dense_config.d_ff,
            activation=dense_config.activation,
            init_scale=dense_config.init_scale,
            **layer_args,
        ),
    )


def command_line(script, argv):
    return f"python benchmarks/{script} " + " ".join(
        shlex.quote(a) for a in (sys.argv[1:] if argv is None else argv)
    )


# ---------------------------------------------------------------------------


class SeqioBatches:
    """The benchmark's batches from the seqio task (needs seqio and TensorFlow)."""

    def __init__(self, args):
        from keras_moe import tasks
        from keras_moe.training.run import input_pipeline as data_lib

        quiet_logs()
        self._data, self._args = data_lib, args
        targets = args.targets or (
            args.inputs
            if "prefix_lm" in args.task
            else tasks.span_corruption_targets_length(args.inputs)
        )
        self.lengths = {"inputs": args.inputs, "targets": targets}
        self.task, self.fallback_reason = pick_task(args.task, FALLBACK_TASK, self.lengths)
        self.vocab_size = tasks.vocabulary_size()
        self._held_out = None

    def train(self, seed):
        """Endless shuffled training batches; the same seed gives the same order."""
        import tensorflow as tf

        tf.random.set_seed(seed)  # seqio's seeded random ops also read TF's global seed
        return self._data.make_dataset(
            self.task,
            self.lengths,
            "train",
            self._args.batch_size,
            shuffle=True,
            seed=seed,
            repeat=True,
        )

    def held_out(self):
        """(finite dataset of the validation batches, its number of target tokens)."""
        if self._held_out is None:
            import keras
            import tensorflow as tf

            # The same held-out set whatever ran before: seqio's seeded ops read TF's
            # global seed too, and timing the models first sets it.
            tf.random.set_seed(None)
            ds = self._data.make_dataset(
                self.task,
                self.lengths,
                "validation",
                self._args.batch_size,
                shuffle=False,
                seed=self._args.seed,
                repeat=False,
            )
            ds = self._data.finite(
                ds.take(self._args.eval_batches) if self._args.eval_batches else ds
            )
            self._held_out = ds, int(sum(float(keras.ops.sum(w)) for _, _, w in ds))
        return self._held_out


class FileBatches:
    """The batches `--export_batches` saved (`benchmarks/batch_files.py`)."""

    def __init__(self, args):
        from benchmarks import batch_files

        self._files, self._dir = batch_files, args.batches
        meta = batch_files.read_meta(args.batches)
        wanted = {
            "task": args.task,
            "batch_size": args.batch_size,
            "eval_batches": args.eval_batches,
            "inputs": args.inputs,
        }
        seeds = seed_list(args)
        if (
            any(meta[k] != v for k, v in wanted.items())
            or args.steps > meta["steps"]
            or not set(seeds) <= set(meta["seeds"])
        ):
            raise SystemExit(
                f"--batches {args.batches} holds --steps {meta['steps']}, seeds {meta['seeds']}, "
                + ", ".join(f"--{k} {meta[k]!r}" for k in sorted(wanted))
                + f"; asked for --steps {args.steps} (at most the saved), seeds {seeds}, "
                + ", ".join(f"--{k} {v!r}" for k, v in sorted(wanted.items()))
            )
        self.lengths, self.task = meta["feature_lengths"], meta["task"]
        self.fallback_reason, self.vocab_size = meta["task_fallback_reason"], meta["vocab_size"]
        self._tokens, self._held_out = meta["held_out_target_tokens"], None

    def train(self, seed):
        return self._files.load_train(self._dir, seed)

    def held_out(self):
        if self._held_out is None:
            self._held_out = self._files.load_held_out(self._dir)
        return self._held_out, self._tokens


def export_batches(args, source):
    """Writes what `FileBatches` reads: the first --steps training batches of
    every seed and the held-out batches."""
    from benchmarks import batch_files

    held_out, tokens = source.held_out()
    seeds = seed_list(args)
    batch_files.export(
        args.export_batches,
        {seed: source.train(seed) for seed in seeds},
        held_out,
        {
            "task": source.task,
            "task_fallback_reason": source.fallback_reason,
            "feature_lengths": source.lengths,
            "vocab_size": source.vocab_size,
            "steps": args.steps,
            "batch_size": args.batch_size,
            "eval_batches": args.eval_batches,
            "inputs": args.inputs,
            "held_out_target_tokens": tokens,
        },
    )
    print(
        f"wrote the batches of seeds {seeds} ({args.steps} steps) and {tokens} held-out "
        f"target tokens to {args.export_batches}",
        flush=True,
    )


def run_in_workers(jobs, argv, workers):
    """Runs each (name, seed) job as `quality.py <argv> --job name:seed` in up to
    `workers` processes at once. Returns {(name, seed): future of its record}."""
    import json
    import subprocess
    import tempfile
    from concurrent.futures import ThreadPoolExecutor

    argv = list(sys.argv[1:] if argv is None else argv)
    directory = tempfile.mkdtemp(prefix="quality_jobs_")

    def one(name, seed):
        path = os.path.join(directory, f"{name}_seed{seed}.json")
        proc = subprocess.run(
            [
                sys.executable,
                os.path.abspath(__file__),
                *argv,
                "--job",
                f"{name}:{seed}",
                "--job_output",
                path,
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        if proc.returncode:
            raise RuntimeError(f"{name} (seed {seed}) failed:\n{proc.stdout[-4000:]}")
        print(proc.stdout.strip().splitlines()[-1], flush=True)
        with open(path) as f:
            return json.load(f)

    pool = ThreadPoolExecutor(workers)
    return {(name, seed): pool.submit(one, name, seed) for name, seed in jobs}


def interleaved_step_times(configs, train_ds, repeats):
    """Median training-step time of a fresh model of each config on one real
    batch, the models timed in turn (`common.interleaved_medians`)."""
    import keras

    from benchmarks import common
    from keras_moe.models import build_model

    x, y, w = next(iter(train_ds))
    steps = {}
    for name, config in configs.items():
        keras.utils.set_random_seed(0)
        model = build_model(config)
        model.compile(**model.compile_defaults(optimizer=keras.optimizers.Adam(1e-3)))
        steps[name] = (lambda m: lambda: m.train_on_batch(x, y, sample_weight=w))(model)
    timings = common.interleaved_medians(steps, repeats)
    print(
        "interleaved step times: "
        + ", ".join(f"{name} {1e3 * t['median']:.0f} ms" for name, t in timings.items()),
        flush=True,
    )
    return {name: {k: v for k, v in t.items() if k != "samples"} for name, t in timings.items()}


def retime(output, step_times, main_configs, table1_configs):
    """Adds `step_times` to the result `output` and recomputes its comparison
    and Table 1 ratios from them; returns the updated payload."""
    from benchmarks import common

    payload = common.read_result(output)
    if payload is None:
        raise SystemExit(f"--retime: no result {common.result_path(output)} to retime")
    runs = payload["runs"]
    dense = step_times["dense"]["median"]
    for name in main_configs:
        if name in runs:
            payload["comparison"][name] = compare(
                runs[name], runs["dense"], step_times[name]["median"] / dense
            )
    for row in payload.get("table1", []):
        if row["name"] in table1_configs:
            row["step_time_vs_dense_interleaved"] = step_times[row["name"]]["median"] / dense
    for name, row in payload.get("dropless_vs_capacity", {}).items():
        row["step_time_ratio"] = (
            step_times[name]["median"] / step_times[name.replace("_dropless", "")]["median"]
        )
        row["step_time_ratio_interleaved"] = True
    payload["interleaved_step_times"] = step_times
    payload["retimed"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    common.write_result(output, payload)
    for name, c in payload["comparison"].items():
        print(
            f"{name}: step time x{c['step_time_vs_dense_interleaved']:.3f} of dense "
            "(interleaved); "
            + (
                "never reaches the dense final value"
                if c["fraction_of_dense_time"] is None
                else f"{100 * c['fraction_of_dense_time']:.0f}% of the dense "
                "training time to its final value"
            ),
            flush=True,
        )
    return payload


# Arguments that only choose which models run or where results go; every other
# argument changes what a model's training measures.
SELECTION_ARGS = frozenset(
    {
        "experts",
        "dropless_experts",
        "no_main",
        "table1",
        "table1_experts",
        "table1_cf",
        "timing_repeats",
        "retime",
        "reuse",
        "output",
        "no_plot",
        "smoke",
        "export_batches",
        "batches",
        "workers",
        "job",
        "job_output",
    }
)


def reusable_runs(output, args):
    """The runs of the existing result `output`, checked to have been trained with
    the same training arguments as `args` ({} if there is no such result)."""
    from benchmarks import common

    payload = common.read_result(output)
    if payload is None:
        return {}
    path = common.result_path(output)
    stored = payload.get("args", {})
    differing = sorted(
        k for k, v in vars(args).items() if k not in SELECTION_ARGS and stored.get(k) != v
    )
    if differing:
        raise SystemExit(
            f"--reuse: {path} was trained with different arguments: "
            + ", ".join(
                f"--{k} {stored.get(k)!r} there, {getattr(args, k)!r} now" for k in differing
            )
        )
    return payload["runs"]


def learning_rate(args):
    """The peak rate, or a warmup + cosine-decay schedule ending at 10% of it."""
    import keras

    if args.schedule == "constant":
        return args.learning_rate
    return keras.optimizers.schedules.CosineDecay(
        initial_learning_rate=0.0 if args.warmup_steps else args.learning_rate,
        warmup_target=args.learning_rate if args.warmup_steps else None,
        warmup_steps=args.warmup_steps,
        decay_steps=args.steps - args.warmup_steps,
        alpha=0.1,
    )


def plot(runs, dense_name, path, title):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for name, run in runs.items():
        steps = [p["step"] for p in run["curve"]][1:]  # step 0 squashes the scale
        values = [p["neg_log_perplexity"] for p in run["curve"]][1:]
        (line,) = ax.plot(
            steps,
            values,
            marker="o",
            markersize=3,
            label=name,
            color="black" if name == dense_name else None,
        )
        if len(run.get("per_seed", [])) > 1:  # min-max band over the seeds
            per_seed = [[p["neg_log_perplexity"] for p in o["curve"]][1:] for o in run["per_seed"]]
            ax.fill_between(
                steps,
                [min(v) for v in zip(*per_seed, strict=False)],
                [max(v) for v in zip(*per_seed, strict=False)],
                color=line.get_color(),
                alpha=0.15,
            )
    if dense_name in runs:
        ax.axhline(
            runs[dense_name]["final_neg_log_perplexity"],
            color="gray",
            ls=":",
            lw=1,
            label="dense final",
        )
    ax.set_xlabel("training step")
    ax.set_ylabel("held-out neg. log perplexity")
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


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
