"""Preprocessor lists shared by the task families.

The lists are functions so that a test can run exactly the list a
registered task uses over a local source (see tests/tasks/test_c4.py).
Span corruption and prefix LM are T5's own (`t5.data.preprocessors`).
"""

import functools

import seqio
import tensorflow as tf
from t5.data import preprocessors as t5_preprocessors

MEAN_NOISE_SPAN_LENGTH = 3.0
NOISE_DENSITY = 0.15


def span_corruption_preprocessors(
    text_key="text", mean_noise_span_length=MEAN_NOISE_SPAN_LENGTH, noise_density=NOISE_DENSITY
):
    """T5's span-corruption recipe (Raffel et al. 2019, "c4_v220_span_corruption").

    Args:
      text_key: feature of the source holding the raw text.
      mean_noise_span_length: mean length of a corrupted span, in tokens.
      noise_density: fraction of tokens corrupted.

    Returns:
      A list of seqio preprocessors producing "inputs" (text with sentinels)
      and "targets" (the dropped spans, each after its sentinel).

    Example:
      >>> preps = span_corruption_preprocessors()
      >>> len(preps)
      5
    """
    if mean_noise_span_length <= 0:
        raise ValueError(f"mean_noise_span_length must be > 0, got {mean_noise_span_length}")
    if not 0 < noise_density < 1:
        raise ValueError(f"noise_density must be in (0, 1), got {noise_density}")
    return _unsupervised_recipe(
        text_key,
        functools.partial(
            t5_preprocessors.span_corruption,
            mean_noise_span_length=mean_noise_span_length,
            noise_density=noise_density,
        ),
    )


def prefix_lm_preprocessors(text_key="text", noise_density=0.5):
    """T5's prefix language-modelling recipe (random split point).

    Args:
      text_key: feature of the source holding the raw text.
      noise_density: expected fraction of tokens in the target (suffix).

    Returns:
      A list of seqio preprocessors; "inputs" is a prefix of a chunk and
      "targets" its continuation.

    Example:
      >>> len(prefix_lm_preprocessors())
      5
    """
    if not 0 < noise_density < 1:
        raise ValueError(f"noise_density must be in (0, 1), got {noise_density}")
    return _unsupervised_recipe(
        text_key, functools.partial(t5_preprocessors.prefix_lm, noise_density=noise_density)
    )


def _unsupervised_recipe(text_key, objective):
    """rekey text -> tokenize -> cache point -> `objective` -> EOS (T5's layout)."""
    return [
        functools.partial(t5_preprocessors.rekey, key_map={"inputs": None, "targets": text_key}),
        seqio.preprocessors.tokenize,
        seqio.CacheDatasetPlaceholder(),
        objective,
        seqio.preprocessors.append_eos_after_trim,
    ]


def span_corruption_targets_length(
    inputs_length, mean_noise_span_length=MEAN_NOISE_SPAN_LENGTH, noise_density=NOISE_DENSITY
):
    """Targets length that span corruption needs for a given inputs length.

    `t5.data.preprocessors.span_corruption` refuses a targets length below this.

    Args:
      inputs_length: the "inputs" sequence length (EOS included).
      mean_noise_span_length: as in `span_corruption_preprocessors`.
      noise_density: as in `span_corruption_preprocessors`.

    Example:
      >>> span_corruption_targets_length(512)
      114
    """
    if inputs_length < 2:
        raise ValueError(f"inputs_length must be >= 2, got {inputs_length}")
    _, targets_length = t5_preprocessors.random_spans_helper(
        inputs_length=inputs_length,
        noise_density=noise_density,
        mean_noise_span_length=mean_noise_span_length,
        extra_tokens_per_span_inputs=1,
        extra_tokens_per_span_targets=1,
        verbose=False,
    )
    return targets_length


@seqio.map_over_dataset
def text_pair_to_translation(x, source_name, target_name, source_key="source", target_key="target"):
    """Maps {source_key, target_key} to T5's "translate X to Y: ..." pair.

    Like `t5.data.preprocessors.translate`, but with explicit language names
    (babel has no locale for some languages, e.g. Tagalog).

    Args:
      x: an example with string features `source_key` and `target_key`.
      source_name: English name of the source language, e.g. "French".
      target_name: English name of the target language, e.g. "English".
      source_key: feature holding the source text.
      target_key: feature holding the target text.

    Example:
      >>> ds = tf.data.Dataset.from_tensors({"source": "Bonjour", "target": "Hi"})
      >>> ex = next(iter(text_pair_to_translation(ds, "French", "English")))
      >>> ex["inputs"].numpy()
      b'translate French to English: Bonjour'
    """
    prefix = f"translate {source_name} to {target_name}: "
    return {
        "inputs": tf.strings.join([prefix, x[source_key]]),
        "targets": x[target_key],
    }


def translation_preprocessors(
    source_name, target_name="English", source_key="source", target_key="target"
):
    """Text-pair translation list: prompt, tokenize, cache point, EOS.

    Example:
      >>> len(translation_preprocessors("French"))
      4
    """
    return [
        functools.partial(
            text_pair_to_translation,
            source_name=source_name,
            target_name=target_name,
            source_key=source_key,
            target_key=target_key,
        ),
        seqio.preprocessors.tokenize,
        seqio.CacheDatasetPlaceholder(),
        seqio.preprocessors.append_eos_after_trim,
    ]
