"""`keras-moe-eval`: loss / neg-log-perplexity of a checkpoint, and BLEU for translation tasks.

With `--export_dir` it writes the checkpoint as a serving SavedModel instead
(token and text signatures; see `keras_moe.models.serving`).

Example:
  keras-moe-eval --model_dir=/tmp/keras_moe_tiny
  keras-moe-eval --model_dir=/tmp/bible --split=test --decode_examples=200
  keras-moe-eval --model_dir=/tmp/keras_moe_tiny --export_dir=/tmp/keras_moe_served
"""

import argparse
import os
import sys

from keras_moe import startup
from keras_moe.gin_config import GinConfigError, parse_gin
from keras_moe.training import evaluate as eval_lib
from keras_moe.training.errors import TrainingConfigError
from keras_moe.training.train_cli import add_gin_flags, error_message, set_tf_environment


def build_parser():
    p = argparse.ArgumentParser(
        prog="keras-moe-eval",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--model_dir", required=True)
    add_gin_flags(p, gin_file_help="gin files (default: <model_dir>/operative_config.gin)")
    p.add_argument("--checkpoint", default=None, help="a .weights.h5 file (default: newest)")
    p.add_argument("--split", default="validation")
    p.add_argument("--eval_batches", type=int, default=20)
    p.add_argument(
        "--decode",
        choices=("auto", "yes", "no"),
        default="auto",
        help="decode + BLEU (auto: for tasks with a BLEU metric)",
    )
    p.add_argument("--decode_examples", type=int, default=32)
    p.add_argument("--max_decode_length", type=int, default=None)
    p.add_argument("--beam_size", type=int, default=1, help="1 = greedy")
    p.add_argument("--task", default=None, help="evaluate on another task than train.task")
    p.add_argument(
        "--export_dir",
        default=None,
        help="write the checkpoint as a serving SavedModel here instead of "
        "evaluating (decoding with --beam_size and --max_decode_length)",
    )
    return p


def main(argv=None):
    set_tf_environment()
    args = build_parser().parse_args(argv)

    startup.quiet_startup()

    try:
        # t5/seqio configurables that operative configs name
        from keras_moe import tasks  # noqa: F401

        if not os.path.isdir(args.model_dir):
            raise TrainingConfigError(f"--model_dir {args.model_dir!r} is not a folder.")
        files = args.gin_file or [os.path.join(args.model_dir, "operative_config.gin")]
        import keras_moe.training.train_configurables  # noqa: F401

        # Unknown configurables are skipped: an operative config may name ones the
        # evaluation does not register; a run file's required macros are the training's.
        parse_gin(
            files, args.gin_bindings, args.gin_allow_import, skip_unknown=True, check_required=False
        )
        method = "greedy" if args.beam_size <= 1 else "beam"
        if args.export_dir:
            exported = eval_lib.export_run(
                args.model_dir,
                args.export_dir,
                args.checkpoint,
                args.max_decode_length,
                method,
                max(args.beam_size, 1),
            )
            print(
                f"[keras_moe] exported {exported['checkpoint']} (step {exported['step']}) "
                f"to {exported['path']}: signatures {', '.join(exported['signatures'])}; "
                f"inputs cut to {exported['max_input_length']} tokens, at most "
                f"{exported['max_length']} output tokens ({method})",
                flush=True,
            )
            return 0
        decode = {"auto": None, "yes": True, "no": False}[args.decode]
        results = eval_lib.evaluate(
            args.model_dir,
            args.checkpoint,
            args.split,
            args.eval_batches,
            decode,
            args.decode_examples,
            args.max_decode_length,
            method,
            max(args.beam_size, 1),
            args.task,
        )
        path = eval_lib.write_results(args.model_dir, results)
    except (TrainingConfigError, GinConfigError) as e:
        print(f"keras-moe-eval: error: {error_message(e)}", file=sys.stderr, flush=True)
        return 2
    print(
        f"[keras_moe] eval of {results['checkpoint']} (step {results['step']}) on "
        f"{results['task']}/{results['split']}:"
    )
    for key in ("loss", "neg_log_perplexity", "accuracy", "bleu"):
        if key in results:
            print(f"  {key:20s} {results[key]:.4f}")
    for sample in results.get("samples", [])[:3]:
        print(
            f"  > {sample['input'][:80]}\n  = {sample['reference'][:80]}\n"
            f"  < {sample['prediction'][:80]}"
        )
    print(f"  written to {path}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
