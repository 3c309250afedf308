"""Evaluation metrics (seqio metric_fns: f(targets, predictions) -> dict)."""

import sacrebleu


def bleu(targets, predictions, tokenize="intl"):
    """Corpus BLEU with sacrebleu, as T5 reports it (intl tokenizer, exp smoothing).

    Args:
      targets: list of reference strings (one reference per example).
      predictions: list of predicted strings, same length.
      tokenize: sacrebleu tokenizer name.

    Returns:
      {"bleu": score in [0, 100]}.

    Example:
      >>> bleu(["the cat sat"], ["the cat sat"])["bleu"]
      100.0
    """
    if len(targets) != len(predictions):
        raise ValueError(
            f"targets and predictions differ in length: {len(targets)} != {len(predictions)}"
        )
    if targets and isinstance(targets[0], (list, tuple)):
        references = [list(r) for r in zip(*targets, strict=False)]
    else:
        references = [list(targets)]
    score = sacrebleu.corpus_bleu(
        list(predictions),
        references,
        smooth_method="exp",
        smooth_value=0.0,
        force=False,
        lowercase=False,
        tokenize=tokenize,
        use_effective_order=False,
    )
    return {"bleu": score.score}
