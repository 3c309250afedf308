"""Where quality.py's batches come from: a seqio task, or the files `--export_batches` wrote."""

from benchmarks.quality_args import FALLBACK_TASK, seed_list

DOCS_HINT = "apt-get update && apt-get install -y python3.11-doc perl-doc"


def quiet_logs():
    """Hides seqio's "uncached FunctionDataset" and tf.function retracing warnings
    (each model is traced once; the data sources are small in-memory ones)."""
    import tensorflow as tf
    from absl import logging

    logging.set_verbosity(logging.ERROR)
    tf.get_logger().setLevel("ERROR")


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
