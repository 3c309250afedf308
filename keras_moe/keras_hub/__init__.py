"""keras_moe for keras-hub's MoE models: `sparsify` a loaded model, or `from_preset` a
Hugging Face or Kaggle checkpoint straight into a sparse one.

Needs keras-hub (`pip install "keras-moe[keras-hub]"`). Import this module before
loading a saved sparse model (`keras.saving.load_model`), as keras-hub's own
classes need `import keras_hub`.
"""

try:
    import keras_hub  # noqa: F401
except ImportError as error:  # pragma: no cover - depends on the environment
    raise ImportError(
        'keras_moe.keras_hub needs keras-hub: pip install "keras-moe[keras-hub]"'
    ) from error

from keras_moe.keras_hub.presets import from_preset
from keras_moe.keras_hub.sparse_block import SparseMoeBlock
from keras_moe.keras_hub.sparsify import is_sparse, sparsify

__all__ = ["SparseMoeBlock", "from_preset", "is_sparse", "sparsify"]
