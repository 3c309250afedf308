"""C4 pre-training tasks in T5's recipe (TFDS "c4/en:3.0.1").

Registered (plus `_byte` twins):
  * `c4_span_corruption`: span corruption, mean span 3, 15% noise.
  * `c4_prefix_lm`: prefix language modelling.

C4 is not downloadable from here; the tasks need a prepared TFDS copy
(see `FIX`).  `c4_preprocessors()` is the exact list the tasks use, so it can
be tested over any source with a "text" feature.

Example:
  >>> from keras_moe import tasks
  >>> ds = tasks.get_dataset("c4_span_corruption",
  ...                        {"inputs": 512, "targets": 114})  # needs the data
"""

from keras_moe.tasks import preprocessors, registry
from keras_moe.tasks.tfds_source import CheckedTfdsSource

TFDS_NAME = "c4/en:3.0.1"
FIX = (
    "a prepared TFDS copy of c4/en:3.0.1: point $TFDS_DATA_DIR at it "
    "(e.g. a mirror of gs://tfds-data/datasets) or build it with "
    "`tfds build c4/en --data_dir=...` (apache-beam, Common Crawl access)"
)


def make_source(tfds_data_dir=None):
    """The C4 TFDS source (checked: a clear error when unprepared)."""
    return CheckedTfdsSource(TFDS_NAME, fix=FIX, tfds_data_dir=tfds_data_dir)


def c4_preprocessors(objective="span_corruption"):
    """Preprocessors of the C4 tasks over examples with a "text" feature.

    Args:
      objective: "span_corruption" or "prefix_lm".

    Example:
      >>> len(c4_preprocessors("prefix_lm"))
      5
    """
    if objective == "span_corruption":
        return preprocessors.span_corruption_preprocessors(text_key="text")
    if objective == "prefix_lm":
        return preprocessors.prefix_lm_preprocessors(text_key="text")
    raise ValueError(f"objective must be 'span_corruption' or 'prefix_lm', got {objective!r}")


def register():
    source = make_source()
    registry.register_task("c4_span_corruption", source, c4_preprocessors("span_corruption"))
    registry.register_task("c4_prefix_lm", source, c4_preprocessors("prefix_lm"))


register()
