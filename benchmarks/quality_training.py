"""Training for quality.py: the learning rate, a run with its eval curve, step timing."""

import statistics
import time


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
