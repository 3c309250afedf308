"""tests/keras_hub/checks.py on the JAX backend, in a fresh process.

Run by tests/keras_hub/test_sparsify.py with the folder of the tiny HF checkpoints and
a scratch folder; prints one "OK <family>" line per family.
"""

import os
import sys

os.environ["KERAS_BACKEND"] = "jax"
os.environ.setdefault("JAX_PLATFORMS", "cpu")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import warnings  # noqa: E402

import keras  # noqa: E402

from tests.keras_hub import checks  # noqa: E402
from tests.keras_hub.hf_checkpoints import FAMILIES  # noqa: E402

assert keras.backend.backend() == "jax"
# Dropless on JAX/CPU warns that it is slow there; these models are tiny.
warnings.filterwarnings("ignore", message=".*dropless.*")

# Every family's sparse forward runs on JAX. Training (JAX's fit reads the metrics through
# RouterMetricsMixin), decoding and saving go through paths the families share: TensorFlow
# checks them for every family, JAX for those that differ most (a balance loss or none;
# expert biases; a plain top-k block).
root, scratch = sys.argv[1], sys.argv[2]
for family in FAMILIES:
    folder = os.path.join(root, family)
    checks.check_logits(folder)
    if family in ("Mixtral", "GptOss"):
        checks.check_training_losses_and_metrics(folder)
    if family == "Qwen3Moe":
        checks.check_greedy_generate(folder)
    if family == "GptOss":  # its experts' biases are saved too
        checks.check_save_and_load(folder, scratch)
    print(f"OK {family}", flush=True)
