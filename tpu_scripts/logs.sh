#!/usr/bin/env bash
# Tail the training log of one worker (default 0).
#   tpu_scripts/logs.sh --name=moe --zone=us-central2-b [--worker=0] [--dry-run]
source "$(dirname "$0")/common.sh"
WORKER=0
for arg in "$@"; do
  case "$arg" in
    --name=*) TPU_NAME="${arg#*=}" ;; --zone=*) ZONE="${arg#*=}" ;;
    --project=*) PROJECT="${arg#*=}" ;; --worker=*) WORKER="${arg#*=}" ;;
    --dry-run) DRY_RUN=1 ;; *) die "unknown argument '$arg'" ;;
  esac
done
check_name
[[ "$WORKER" =~ ^[0-9]+$ ]] || die "--worker must be a worker index, got '$WORKER'"
extra=(); [[ -n "$PROJECT" ]] && extra+=("--project=$PROJECT")
run gcloud compute tpus tpu-vm ssh "$TPU_NAME" "--zone=$ZONE" "--worker=$WORKER" "${extra[@]}" "--command=tail -n 100 -f ~/keras_moe_train.log"
