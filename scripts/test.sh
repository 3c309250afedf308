#!/usr/bin/env bash
# Runs the test suite (TensorFlow backend; JAX checks run in subprocesses) on
# two pytest-xdist workers; KERAS_MOE_TEST_WORKERS=N sets how many (0: none).
#
#   bash scripts/test.sh                            # the whole suite
#   bash scripts/test.sh --fast                     # unit tests only (no e2e), both backends
#   bash scripts/test.sh tests/core -k routing      # only the given paths
set -euo pipefail
cd "$(dirname "$0")/.."
export TF_CPP_MIN_LOG_LEVEL=3 JAX_PLATFORMS=cpu PYTHONHASHSEED=0
workers="${KERAS_MOE_TEST_WORKERS:-2}"
parallel=()
if [[ "$workers" != 0 ]]; then
  # loadgroup: tests marked with one xdist_group share a worker (and its
  # once-per-session subprocess); the rest go to whichever worker is free.
  parallel=(-n "$workers" --dist loadgroup)
fi
fast=()
args=()
for arg in "$@"; do
  if [[ "$arg" == --fast ]]; then
    # The tests that start no process and train no whole job (tests/conftest.py
    # marks the others e2e), plus the layer harness on JAX: the edit loop's tier.
    fast=(-m "not e2e or jax_harness")
  else
    args+=("$arg")
  fi
done
# No path among the arguments: the whole suite.
paths=tests
for arg in "${args[@]+"${args[@]}"}"; do
  [[ "$arg" != -* && -e "${arg%%::*}" ]] && paths=
done
exec python -m pytest $paths "${parallel[@]}" "${fast[@]+"${fast[@]}"}" --durations=15 \
  "${args[@]+"${args[@]}"}"
