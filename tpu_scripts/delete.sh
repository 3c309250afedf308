#!/usr/bin/env bash
# Delete a TPU VM.
#   tpu_scripts/delete.sh --name=moe --zone=us-central2-b [--dry-run]
source "$(dirname "$0")/common.sh"
for arg in "$@"; do
  case "$arg" in
    --name=*) TPU_NAME="${arg#*=}" ;; --zone=*) ZONE="${arg#*=}" ;;
    --project=*) PROJECT="${arg#*=}" ;; --dry-run) DRY_RUN=1 ;;
    *) die "unknown argument '$arg'" ;;
  esac
done
check_name
extra=(); [[ -n "$PROJECT" ]] && extra+=("--project=$PROJECT")
run gcloud compute tpus tpu-vm delete "$TPU_NAME" "--zone=$ZONE" --quiet "${extra[@]}"
