#!/usr/bin/env bash
# Install keras_moe on every worker of a TPU VM.
#   tpu_scripts/setup.sh --name=moe --zone=us-central2-b [--package=git+https://...|keras_moe] [--dry-run]
source "$(dirname "$0")/common.sh"
PACKAGE="keras_moe"
for arg in "$@"; do
  case "$arg" in
    --name=*) TPU_NAME="${arg#*=}" ;; --zone=*) ZONE="${arg#*=}" ;;
    --project=*) PROJECT="${arg#*=}" ;; --package=*) PACKAGE="${arg#*=}" ;;
    --dry-run) DRY_RUN=1 ;; *) die "unknown argument '$arg'" ;;
  esac
done
check_name
CMD="python3 -m pip install -U pip && python3 -m pip install 'tensorflow-tpu==2.21.*' -f https://storage.googleapis.com/libtpu-tf-releases/index.html && python3 -m pip install '$PACKAGE' && python3 -m pip install --no-deps t5==0.9.4"
extra=(); [[ -n "$PROJECT" ]] && extra+=("--project=$PROJECT")
run gcloud compute tpus tpu-vm ssh "$TPU_NAME" "--zone=$ZONE" --worker=all "${extra[@]}" "--command=$CMD"
