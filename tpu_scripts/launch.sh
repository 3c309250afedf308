#!/usr/bin/env bash
# Launch a training job on all workers (in the background, logging to ~/keras_moe_train.log).
#   tpu_scripts/launch.sh --name=moe --zone=us-central2-b --gin_file=pretrain_c4.gin \
#       --model_dir=/mnt/runs/c4 [--gin_bindings='SwitchFeedForward.num_experts = 16' ...] \
#       [--tfds_data_dir=gs://BUCKET/tensorflow_datasets] [--backend=jax] [--dry-run]
# --model_dir is a folder on every worker (a gcsfuse mount of a bucket; gs:// paths are
# refused by the checkpoint writer); --tfds_data_dir sets $TFDS_DATA_DIR for the job.
# --backend=tensorflow (default): a StrategyPlacement of strategy "tpu", every variable replicated on every chip.
# --backend=jax: KERAS_BACKEND=jax with one process per worker joined by
#   --coordinator_address=auto; the gin file's MeshPlacement shards the experts over all chips
#   of the slice (e.g. pretrain_c4_mesh.gin; install with setup.sh --backend=jax).
source "$(dirname "$0")/common.sh"
GIN_FILE=""; MODEL_DIR=""; TFDS_DIR=""; BINDINGS=(); BACKEND="tensorflow"
for arg in "$@"; do
  case "$arg" in
    --name=*) TPU_NAME="${arg#*=}" ;; --zone=*) ZONE="${arg#*=}" ;;
    --project=*) PROJECT="${arg#*=}" ;; --gin_file=*) GIN_FILE="${arg#*=}" ;;
    --model_dir=*) MODEL_DIR="${arg#*=}" ;; --gin_bindings=*) BINDINGS+=("${arg#*=}") ;;
    --tfds_data_dir=*) TFDS_DIR="${arg#*=}" ;; --backend=*) BACKEND="${arg#*=}" ;;
    --dry-run) DRY_RUN=1 ;; *) die "unknown argument '$arg'" ;;
  esac
done
check_name
[[ -n "$GIN_FILE" ]] || die "--gin_file is required"
[[ -n "$MODEL_DIR" ]] || die "--model_dir is required"
[[ "$MODEL_DIR" != gs://* ]] || die "--model_dir '$MODEL_DIR': mount the bucket on every worker (gcsfuse, see tpu_scripts/README.md) and give the mounted folder"
case "$BACKEND" in
  tensorflow) TRAIN="JAX_PLATFORMS=cpu" ;;  # JAX (seqio's) must not take the chips
  jax) TRAIN="KERAS_BACKEND=jax" ;;
  *) die "--backend must be tensorflow or jax, got '$BACKEND'" ;;
esac
[[ -z "$TFDS_DIR" ]] || TRAIN+=" TFDS_DATA_DIR=$(printf %q "$TFDS_DIR")"
TRAIN+=" keras-moe-train --gin_file=$(printf %q "$GIN_FILE") --model_dir=$(printf %q "$MODEL_DIR")"
if [[ "$BACKEND" == jax ]]; then
  TRAIN+=" --coordinator_address=auto"
else
  for b in 'train.placement = @StrategyPlacement()' 'StrategyPlacement.strategy = "tpu"' \
           'StrategyPlacement.tpu_name = "local"'; do
    TRAIN+=" --gin_bindings=$(printf %q "$b")"
  done
fi
for b in "${BINDINGS[@]+"${BINDINGS[@]}"}"; do TRAIN+=" --gin_bindings=$(printf %q "$b")"; done
CMD="nohup $TRAIN > ~/keras_moe_train.log 2>&1 &"
extra=(); [[ -n "$PROJECT" ]] && extra+=("--project=$PROJECT")
run gcloud compute tpus tpu-vm ssh "$TPU_NAME" "--zone=$ZONE" --worker=all "${extra[@]}" "--command=$CMD"
