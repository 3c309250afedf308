#!/usr/bin/env bash
# Runs the whole test suite (TensorFlow backend; JAX checks run in subprocesses).
set -euo pipefail
cd "$(dirname "$0")/.."
export TF_CPP_MIN_LOG_LEVEL=3 JAX_PLATFORMS=cpu PYTHONHASHSEED=0
# No path among the arguments: the whole suite.
paths=tests
for arg in "$@"; do
  [[ "$arg" != -* && -e "${arg%%::*}" ]] && paths=
done
exec python -m pytest $paths --durations=15 "$@"
