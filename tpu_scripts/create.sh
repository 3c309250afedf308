#!/usr/bin/env bash
# Create a Cloud TPU VM.
#   tpu_scripts/create.sh --name=moe --zone=us-central2-b --type=v4-8 [--project=P] [--spot] [--dry-run]
source "$(dirname "$0")/common.sh"
TYPE=""; VERSION=""; SPOT=0
for arg in "$@"; do
  case "$arg" in
    --name=*) TPU_NAME="${arg#*=}" ;; --zone=*) ZONE="${arg#*=}" ;;
    --project=*) PROJECT="${arg#*=}" ;; --type=*) TYPE="${arg#*=}" ;;
    --version=*) VERSION="${arg#*=}" ;; --spot) SPOT=1 ;; --dry-run) DRY_RUN=1 ;;
    *) die "unknown argument '$arg'" ;;
  esac
done
check_name
[[ "$TYPE" =~ ^(v4-(8|16|32|64|128|256|512|1024|2048|4096)|v5litepod-(1|4|8|16|32|64|128|256))$ ]] \
  || die "--type '$TYPE' must be a v4 (v4-8 ... v4-4096) or v5e (v5litepod-1 ... v5litepod-256) size"
if [[ -z "$VERSION" ]]; then
  if [[ "$TYPE" == v4-* ]]; then VERSION="tpu-ubuntu2204-base"; else VERSION="v2-alpha-tpuv5-lite"; fi
fi
extra=()
[[ "$SPOT" == 1 ]] && extra+=(--spot)
[[ -n "$PROJECT" ]] && extra+=("--project=$PROJECT")
run gcloud compute tpus tpu-vm create "$TPU_NAME" "--zone=$ZONE" "--accelerator-type=$TYPE" \
  "--version=$VERSION" "${extra[@]}"
