#!/usr/bin/env bash
# Shared argument parsing for the Cloud TPU VM scripts. Every script accepts
# --dry-run (print the gcloud commands instead of running them).
set -euo pipefail
DRY_RUN=0
TPU_NAME=""
ZONE=""
PROJECT=""
die() { echo "error: $*" >&2; exit 2; }
run() {
  if [[ "$DRY_RUN" == 1 ]]; then
    printf '%q ' "$@"; echo
  else
    "$@"
  fi
}
check_name() {
  [[ -n "$TPU_NAME" ]] || die "--name is required"
  [[ "$TPU_NAME" =~ ^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$ ]] || die "--name '$TPU_NAME' is not a valid TPU name (lowercase letters, digits, '-')"
  [[ -n "$ZONE" ]] || die "--zone is required (e.g. us-central2-b)"
}
project_args() { if [[ -n "$PROJECT" ]]; then echo "--project=$PROJECT"; fi; }
