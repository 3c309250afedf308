"""The command line of benchmarks/quality.py: its arguments, checked, and its seeds."""

import argparse
import shlex
import sys

FALLBACK_TASK = "embedded_prefix_lm"
# --help's description: the first line of quality.py's docstring.
DESCRIPTION = (
    "Quality at equal compute: dense T5.1.1 vs Switch-8/Switch-16 "
    "(Switch Transformer Fig. 1/Tab. 1)."
)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=DESCRIPTION)
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


def command_line(script, argv):
    return f"python benchmarks/{script} " + " ".join(
        shlex.quote(a) for a in (sys.argv[1:] if argv is None else argv)
    )
