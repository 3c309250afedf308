"""Distilling a Switch teacher into a dense T5 student (Switch Transformer §4.2, Table 6).

Trains, on the same data and for the same number of steps, a dense T5 baseline
and a Switch teacher of the same shape; then distils the teacher into a dense
student of the baseline's shape (non-expert weights copied from the teacher,
loss 0.75 hard + 0.25 soft). Reports the held-out negative log perplexity of
each (weighted mean log-probability of the target tokens on the validation
split) and the fraction of the teacher's gain over the baseline that the
student keeps: `(student - dense) / (teacher - dense)` (paper: 29-37%).
The student starts from the teacher's weights, so it has seen twice the steps
in all; the baseline trained on for another `--steps` (same batches) is
reported as that control, with the fraction kept against it.

    python benchmarks/distill.py                       # docs_span_corruption, ~10 min on 2 cores
    python benchmarks/distill.py --steps 100 --eval_batches 4   # a quick look
    python benchmarks/distill.py --task embedded_span_corruption

The docs task needs `apt-get install -y python3.11-doc perl-doc`; without the
Debian docs the embedded English corpus (`embedded_span_corruption`) is used.
Writes `benchmarks/results/distill.json`.
"""

import argparse
import os
import shlex
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--task", default="docs_span_corruption",
                   help="seqio task; falls back to embedded_span_corruption if its data is missing")
    p.add_argument("--inputs", type=int, default=128, help="encoder length")
    p.add_argument("--targets", type=int, default=29, help="decoder length")
    p.add_argument("--batch_size", type=int, default=16)
    p.add_argument("--steps", type=int, default=400, help="training steps of each model")
    p.add_argument("--eval_batches", type=int, default=8, help="validation batches")
    p.add_argument("--d_model", type=int, default=64)
    p.add_argument("--d_ff", type=int, default=128)
    p.add_argument("--num_heads", type=int, default=4)
    p.add_argument("--layers", type=int, default=2, help="encoder and decoder layers each")
    p.add_argument("--experts", type=int, default=8)
    p.add_argument("--learning_rate", type=float, default=3e-3)
    p.add_argument("--alpha", type=float, default=0.25, help="weight of the soft term")
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--expert_init", default="none", choices=["none", "mean", "expert0"])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None, help="result file (default benchmarks/results/distill.json)")
    return p.parse_args(argv)


def pick_task(name):
    import tasks
    from keras_moe.training import data as data_lib
    from keras_moe.training.errors import TrainingConfigError

    try:
        data_lib.check_not_empty(data_lib.make_dataset(name, {"inputs": 32, "targets": 8},
                                                       "validation", 1, repeat=False), name,
                                 "validation")
        return name
    except (TrainingConfigError, tasks.SourceMissingError) as e:
        print(f"task {name!r} unavailable ({e}); using embedded_span_corruption", flush=True)
        return "embedded_span_corruption"


def _percent(fraction):
    return "n/a (the teacher does not beat this baseline)" if fraction is None \
        else f"{100 * fraction:.1f}%"


def main(argv=None):
    args = parse_args(argv)
    import keras

    import tasks
    from benchmarks import common
    from keras_moe.distill import build_distiller
    from keras_moe.models import T5Config, build_model, count_params
    from keras_moe.training import data as data_lib

    command = "python benchmarks/distill.py " + " ".join(shlex.quote(a) for a in
                                                         (sys.argv[1:] if argv is None else argv))
    task = pick_task(args.task)
    lengths = {"inputs": args.inputs, "targets": args.targets}
    dense_config = T5Config(
        vocab_size=tasks.get_vocabulary().vocab_size, d_model=args.d_model,
        num_heads=args.num_heads, d_kv=args.d_model // args.num_heads, d_ff=args.d_ff,
        num_encoder_layers=args.layers, num_decoder_layers=args.layers, activation="relu",
        dropout_rate=0.0)
    switch_config = dense_config.replace(moe_type="switch", num_experts=args.experts,
                                         encoder_sparse_step=2, decoder_sparse_step=2)

    def train_data():
        return data_lib.make_dataset(task, lengths, "train", args.batch_size, shuffle=True,
                                     seed=args.seed, repeat=True)

    held_out = data_lib.finite(data_lib.make_dataset(
        task, lengths, "validation", args.batch_size, shuffle=False, seed=args.seed,
        repeat=False).take(args.eval_batches))

    def optimizer():
        return keras.optimizers.Adam(args.learning_rate)

    def fit(model, name):
        start = time.time()
        history = model.fit(train_data(), steps_per_epoch=args.steps, epochs=1, verbose=2)
        seconds = time.time() - start
        result = model.evaluate(held_out, verbose=0, return_dict=True)
        out = {"neg_log_perplexity": float(result["neg_log_perplexity"]),
               "accuracy": float(result["accuracy"]),
               "train_loss_last": float(history.history["loss"][-1]),
               "train_seconds": seconds}
        print(f"{name}: {out}", flush=True)
        return out

    results = {}
    keras.utils.set_random_seed(args.seed)
    dense = build_model(dense_config)
    dense.compile(**dense.compile_defaults(optimizer=optimizer()))
    results["dense_baseline"] = fit(dense, "dense baseline")
    # Control: the student sees 2 x steps in all (teacher's, then its own);
    # the baseline trained on for as long shows how much of its gain is that.
    results["dense_baseline_2x_steps"] = fit(dense, "dense baseline, 2 x steps")

    keras.utils.set_random_seed(args.seed)
    teacher = build_model(switch_config)
    teacher.compile(**teacher.compile_defaults(optimizer=optimizer()))
    results["switch_teacher"] = fit(teacher, "switch teacher")

    keras.utils.set_random_seed(args.seed)
    distiller = build_distiller(teacher=teacher, alpha=args.alpha, temperature=args.temperature,
                                expert_init=args.expert_init)
    distiller.compile(**distiller.compile_defaults(optimizer=optimizer()))
    results["distilled_student"] = fit(distiller, "distilled student")

    nlp = {k: v["neg_log_perplexity"] for k, v in results.items()}
    gain = nlp["switch_teacher"] - nlp["dense_baseline"]
    gain_2x = nlp["switch_teacher"] - nlp["dense_baseline_2x_steps"]
    # A fraction of a gain only means something when there is a gain (None otherwise).
    kept = (nlp["distilled_student"] - nlp["dense_baseline"]) / gain if gain > 0 else None
    kept_2x = ((nlp["distilled_student"] - nlp["dense_baseline_2x_steps"]) / gain_2x
               if gain_2x > 0 else None)
    params = {"dense_baseline": count_params(dense_config),
              "switch_teacher": count_params(switch_config),
              "distilled_student": count_params(distiller.student.config)}
    payload = {
        "command": command, "task": task, "feature_lengths": lengths, "args": vars(args),
        "results": results, "params": params,
        "compression": 1.0 - params["distilled_student"] / params["switch_teacher"],
        "teacher_gain_neg_log_perplexity": gain,
        "teacher_gain_vs_dense_2x_steps": gain_2x,
        "fraction_of_teacher_gain_kept": kept,
        "fraction_kept_vs_dense_2x_steps": kept_2x,
        "note": "the student starts from the teacher's non-expert weights, so it has seen "
                "2 x steps of data in all; dense_baseline_2x_steps is that control",
        "paper": "Switch Transformer Table 6: 29-37% of the gain kept at 82-99% compression",
        "environment": common.environment(),
    }
    if args.out:
        import json

        with open(args.out, "w") as f:
            json.dump(payload, f, indent=2, sort_keys=True)
        path = args.out
    else:
        path = common.write_result("distill", payload)
    print(f"neg log perplexity: dense {nlp['dense_baseline']:.4f}, teacher "
          f"{nlp['switch_teacher']:.4f}, student {nlp['distilled_student']:.4f}; "
          f"teacher gain kept {_percent(kept)} at {100 * payload['compression']:.1f}% "
          "compression", flush=True)
    print(f"against the dense baseline trained 2 x steps "
          f"({nlp['dense_baseline_2x_steps']:.4f}): {_percent(kept_2x)} kept", flush=True)
    print(f"wrote {path}\ncommand: {command}", flush=True)
    return payload


if __name__ == "__main__":
    main()
