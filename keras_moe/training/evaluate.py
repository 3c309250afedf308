"""Evaluation of a trained checkpoint: loss / neg-log-perplexity, and BLEU for translation."""

import json
import os
import warnings

import numpy as np

from keras_moe.models.decoding import pad_input_tokens, strip_ids
from keras_moe.models.serving import export_for_serving
from keras_moe.training import checkpoint as ckpt_lib
from keras_moe.training.errors import TrainingConfigError
from keras_moe.training.run import input_pipeline as data_lib
from keras_moe.training.run.compiled_model import build_compiled_model
from keras_moe.training.run.training_run import set_eval_routing


def is_translation(task_name):
    """True when the task (or any task of the mixture) has a BLEU metric."""
    import seqio

    task = seqio.get_mixture_or_task(task_name)
    subtasks = getattr(task, "tasks", None) or [task]
    for sub in subtasks:
        for fn in getattr(sub, "metric_fns", ()) or ():
            name = getattr(fn, "__name__", "") or getattr(getattr(fn, "func", None), "__name__", "")
            if "bleu" in name.lower():
                return True
    return False


def decode_bleu(
    model,
    task_name,
    feature_lengths,
    split,
    num_examples,
    max_decode_length=None,
    method="greedy",
    num_beams=4,
    batch_size=16,
):
    """Greedy/beam decodes `num_examples` examples and scores them with sacrebleu.

    Uses the tasks' own BLEU (`tasks.metrics.bleu`: intl tokenizer, exp
    smoothing, as T5 reports it), so scores match the seqio metric's.

    Returns (score dict, list of (input, prediction, reference) strings).
    """
    import seqio

    from keras_moe.tasks import metrics as task_metrics

    task = seqio.get_mixture_or_task(task_name)
    ds = task.get_dataset(
        dict(feature_lengths), split=split, shuffle=False, num_epochs=1, seed=0, use_cached=False
    )
    vocab = task.output_features["targets"].vocabulary
    in_vocab = task.output_features["inputs"].vocabulary
    length = feature_lengths["inputs"]
    max_len = max_decode_length or feature_lengths["targets"]
    examples = list(ds.take(num_examples).as_numpy_iterator())
    if not examples:
        raise TrainingConfigError(f"task {task_name!r} split {split!r} has no examples to decode.")
    preds, refs, inputs = [], [], []
    for start in range(0, len(examples), batch_size):
        chunk = examples[start : start + batch_size]
        tokens = pad_input_tokens([ex["inputs"] for ex in chunk], length)
        out = np.asarray(
            model.generate(tokens, max_length=max_len, method=method, num_beams=num_beams)
        )
        for row, ex in enumerate(chunk):
            preds.append(vocab.decode(strip_ids(out[row])))
            ref = ex.get("targets_pretokenized")
            refs.append(
                ref.decode("utf-8")
                if isinstance(ref, bytes)
                else vocab.decode(strip_ids(ex["targets"]))
            )
            inputs.append(in_vocab.decode(strip_ids(ex["inputs"])))
    bleu = task_metrics.bleu(refs, preds)["bleu"]
    return {"bleu": float(bleu), "decoded_examples": len(preds)}, list(
        zip(inputs, preds, refs, strict=False)
    )


def restore_from_run(model_dir, checkpoint=None):
    """The gin-configured model with the newest (or the given) checkpoint of `model_dir`.

    Returns:
        `(model, checkpoint metadata, the job's checked DatasetConfig)`.
    """
    from keras_moe.training import train_configurables

    job = train_configurables.job_config()
    dataset = job.dataset
    if dataset is None or dataset.feature_lengths is None:
        raise TrainingConfigError(
            "the gin config binds no train.dataset with its task and feature_lengths; pass "
            "--gin_file (e.g. the run's operative_config.gin)."
        )
    dataset.check()
    if checkpoint is None:
        meta = ckpt_lib.CheckpointManager(os.path.join(model_dir, "checkpoints")).latest()
        if meta is None:
            raise TrainingConfigError(f"no checkpoint in {model_dir}/checkpoints.")
    else:
        if not os.path.isfile(checkpoint):
            raise TrainingConfigError(f"checkpoint {checkpoint!r} does not exist.")
        meta = {"path": checkpoint, "step": None}
    # The run's optimizer, as gin binds it: the checkpoint holds its variables.
    model = build_compiled_model(optimizer=train_configurables.make_optimizer)
    set_eval_routing(model, job.eval_routing)  # the run's train.eval_routing
    ckpt_lib.restore(model, meta, seed_states=False)  # evaluation draws no random numbers
    return model, meta, dataset


def export_run(
    model_dir, export_dir, checkpoint=None, max_decode_length=None, method="greedy", num_beams=4
):
    """Writes the run's checkpoint as a serving SavedModel (`export_for_serving`).

    The encoder length and the default output length are the run's
    `feature_lengths`; the text signature uses the task's vocabulary when it
    is a SentencePiece one.

    Returns:
        dict: the SavedModel's path, checkpoint, step, lengths and signatures.
    """
    import seqio

    model, meta, dataset = restore_from_run(model_dir, checkpoint)
    task = seqio.get_mixture_or_task(dataset.task)
    vocabulary = task.output_features["inputs"].vocabulary
    if not isinstance(vocabulary, seqio.SentencePieceVocabulary):
        vocabulary = None  # a byte vocabulary: the token signature only
    lengths = dataset.feature_lengths
    max_length = max_decode_length or lengths["targets"]
    export_for_serving(
        model,
        export_dir,
        vocabulary=vocabulary,
        max_input_length=lengths["inputs"],
        max_length=max_length,
        method=method,
        num_beams=num_beams,
    )
    return {
        "path": export_dir,
        "checkpoint": meta["path"],
        "step": int(model.optimizer.iterations.numpy()),
        "max_input_length": lengths["inputs"],
        "max_length": max_length,
        "signatures": ["generate_ids"] + (["generate_text"] if vocabulary else []),
    }


def evaluate(
    model_dir,
    checkpoint=None,
    split="validation",
    eval_batches=20,
    decode=None,
    decode_examples=32,
    max_decode_length=None,
    method="greedy",
    num_beams=4,
    task=None,
):
    """Evaluates the newest (or the given) checkpoint of `model_dir`.

    The model, task, feature lengths and batch size come from the parsed gin
    config (normally `model_dir/operative_config.gin`).

    Returns:
        dict: loss, accuracy, neg_log_perplexity (token-weighted, padding
        excluded) and, for translation tasks (or `decode=True`), bleu.
    """

    model, meta, dataset = restore_from_run(model_dir, checkpoint)
    task = task or dataset.task
    feature_lengths = dataset.feature_lengths
    step = int(model.optimizer.iterations.numpy())
    ds = data_lib.make_dataset(
        task,
        feature_lengths,
        split,
        dataset.batch_size,
        pack=dataset.pack,
        shuffle=False,
        seed=0,
        repeat=False,
    ).take(eval_batches)
    data_lib.check_not_empty(ds, task, split)
    ds = data_lib.finite(ds)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        results = model.evaluate(ds, verbose=0, return_dict=True)
    results = {k: float(v) for k, v in results.items()}
    results.update(checkpoint=meta["path"], step=step, task=task, split=split)
    if decode is None:
        decode = is_translation(task)
    if decode:
        scores, samples = decode_bleu(
            model,
            task,
            feature_lengths,
            split,
            decode_examples,
            max_decode_length,
            method,
            num_beams,
        )
        results.update(scores)
        results["samples"] = [
            {"input": i, "prediction": p, "reference": r} for i, p, r in samples[:5]
        ]
    return results


def write_results(model_dir, results):
    path = os.path.join(model_dir, f"eval_{results['split']}_step{results['step']}.json")
    ckpt_lib.atomic_write_text(path, json.dumps(results, indent=1))
    return path
