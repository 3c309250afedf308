"""WMT translation tasks through TFDS, in T5's recipe.

Registered (plus `_byte` twins), named `<wmt>_<src><tgt>`:
  wmt14_ende, wmt14_deen  (wmt14_translate/de-en)
  wmt14_enfr, wmt14_fren  (wmt14_translate/fr-en)
  wmt16_enro, wmt16_roen  (wmt16_translate/ro-en)
  wmt19_ende, wmt19_deen  (wmt19_translate/de-en)
Inputs "translate English to German: ...", targets the reference; BLEU with
sacrebleu (`tasks.metrics.bleu`).  The data needs a prepared TFDS copy.

Example:
  >>> from keras_moe import tasks
  >>> ds = tasks.get_dataset("wmt14_ende", {"inputs": 256, "targets": 256})
"""

import functools

import seqio
from t5.data import preprocessors as t5_preprocessors

from keras_moe.tasks import metrics, registry
from keras_moe.tasks.tfds_source import CheckedTfdsSource

# task prefix -> (TFDS name, the non-English language of the pair)
WMT_DATASETS = {
    "wmt14_en{x}": ("wmt14_translate/{x}-en:1.0.0", ("de", "fr")),
    "wmt16_en{x}": ("wmt16_translate/{x}-en:1.0.0", ("ro",)),
    "wmt19_en{x}": ("wmt19_translate/{x}-en:1.0.0", ("de",)),
}


def fix_for(tfds_name):
    return (
        f"a prepared TFDS copy of {tfds_name}: "
        f"`tfds build {tfds_name.split(':')[0]} --data_dir=...` on a machine "
        "with internet, then point $TFDS_DATA_DIR at it"
    )


def translation_preprocessors(source_language, target_language):
    """T5's WMT list: `t5.data.preprocessors.translate`, tokenize, cache, EOS.

    Args:
      source_language: key of the source text in the TFDS example ("en").
      target_language: key of the target text ("de").

    Example:
      >>> len(translation_preprocessors("en", "de"))
      4
    """
    return [
        functools.partial(
            t5_preprocessors.translate,
            source_language=source_language,
            target_language=target_language,
        ),
        seqio.preprocessors.tokenize,
        seqio.CacheDatasetPlaceholder(),
        seqio.preprocessors.append_eos_after_trim,
    ]


def wmt_tasks():
    """[(task base name, tfds name, source language, target language)]."""
    out = []
    for pattern, (tfds_pattern, langs) in WMT_DATASETS.items():
        for x in langs:
            tfds_name = tfds_pattern.format(x=x)
            en_x = pattern.format(x=x)
            x_en = en_x[:-4] + f"{x}en"
            out.append((en_x, tfds_name, "en", x))
            out.append((x_en, tfds_name, x, "en"))
    return out


def register():
    for name, tfds_name, src, tgt in wmt_tasks():
        registry.register_task(
            name,
            CheckedTfdsSource(tfds_name, fix=fix_for(tfds_name)),
            translation_preprocessors(src, tgt),
            metric_fns=[metrics.bleu],
        )


register()
