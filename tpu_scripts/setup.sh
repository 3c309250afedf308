#!/usr/bin/env bash
# Install keras_moe on every worker of a TPU VM: from this repository (default),
# from a git repository URL, or from a wheel. keras_moe is not published on a
# package index, so it is never installed by name.
#
#   tpu_scripts/setup.sh --name=moe --zone=us-central2-b [--project=P] [--dry-run]
#       this checkout's committed HEAD (git archive) is copied to every worker,
#       unpacked to ~/keras_moe and installed with scripts/install.sh
#   tpu_scripts/setup.sh ... --repo=https://github.com/ORG/keras_moe.git [--ref=main]
#       every worker clones that repository to ~/keras_moe instead
#   tpu_scripts/setup.sh ... --wheel=dist/keras_moe-0.1.0-py3-none-any.whl
#       a wheel built with `python -m build` is copied and installed
#   --backend=jax    installs JAX's TPU runtime (jax[tpu], the installed jax's version)
#                    for `launch.sh --backend=jax` instead of TensorFlow's
#
# Then the TPU build of TensorFlow is installed (last, so that its files are the
# ones in place), and the keras-moe-* commands are linked into /usr/local/bin,
# where launch.sh's non-login ssh shell finds them.
source "$(dirname "$0")/common.sh"
REPO_URL=""; REF=""; WHEEL=""; BACKEND="tensorflow"
for arg in "$@"; do
  case "$arg" in
    --name=*) TPU_NAME="${arg#*=}" ;; --zone=*) ZONE="${arg#*=}" ;;
    --project=*) PROJECT="${arg#*=}" ;; --repo=*) REPO_URL="${arg#*=}" ;;
    --ref=*) REF="${arg#*=}" ;; --wheel=*) WHEEL="${arg#*=}" ;;
    --backend=*) BACKEND="${arg#*=}" ;;
    --package=*) die "--package is gone: keras_moe is not on the package index; use --repo=URL, --wheel=PATH, or neither (this checkout)" ;;
    --dry-run) DRY_RUN=1 ;; *) die "unknown argument '$arg'" ;;
  esac
done
check_name
[[ -z "$REPO_URL" || -z "$WHEEL" ]] || die "give --repo or --wheel, not both"
[[ -z "$REF" || -n "$REPO_URL" ]] || die "--ref needs --repo"
[[ "$BACKEND" == tensorflow || "$BACKEND" == jax ]] || die "--backend must be tensorflow or jax, got '$BACKEND'"
if [[ -n "$WHEEL" ]]; then
  [[ "$WHEEL" == *.whl ]] || die "--wheel '$WHEEL' is not a .whl file (build one with: python -m build --wheel)"
  [[ "$DRY_RUN" == 1 || -f "$WHEEL" ]] || die "--wheel: no file '$WHEEL'"
fi

extra=(); [[ -n "$PROJECT" ]] && extra+=("--project=$PROJECT")
copy_to_workers() {
  run gcloud compute tpus tpu-vm scp "$1" "$TPU_NAME:$2" "--zone=$ZONE" --worker=all "${extra[@]}"
}
TF_TPU="python3 -m pip install 'tensorflow-tpu==2.21.*' -f https://storage.googleapis.com/libtpu-tf-releases/index.html"
LINK='for f in ~/.local/bin/keras-moe-*; do if [ -e "$f" ]; then sudo ln -sf "$f" /usr/local/bin/; fi; done'
if [[ -n "$WHEEL" ]]; then
  name="$(basename "$WHEEL")"
  copy_to_workers "$WHEEL" "$name"
  INSTALL="python3 -m pip install ~/$(printf %q "$name") && python3 -m pip install --no-deps t5==0.9.4"
elif [[ -n "$REPO_URL" ]]; then
  INSTALL="rm -rf ~/keras_moe && git clone --depth 1 ${REF:+--branch $(printf %q "$REF") }$(printf %q "$REPO_URL") ~/keras_moe && (cd ~/keras_moe && bash scripts/install.sh)"
else
  repo_root="$(cd "$(dirname "$0")/.." && pwd)"
  archive="${TMPDIR:-/tmp}/keras_moe-src.tar.gz"
  run git -C "$repo_root" archive --format=tar.gz --prefix=keras_moe/ -o "$archive" HEAD
  copy_to_workers "$archive" keras_moe-src.tar.gz
  INSTALL="rm -rf ~/keras_moe && tar -xzf ~/keras_moe-src.tar.gz -C ~ && (cd ~/keras_moe && bash scripts/install.sh)"
fi
CMD="python3 -m pip install -U pip && $INSTALL"
if [[ "$BACKEND" == jax ]]; then
  # JAX's TPU runtime for the jax that seqio brought in (same version, so nothing else moves);
  # TensorFlow stays the plain build: it only reads the input, and must not hold the chips.
  CMD+=" && python3 -m pip install \"jax[tpu]==\$(python3 -c 'import jax; print(jax.__version__)')\" -f https://storage.googleapis.com/jax-releases/libtpu_releases.html"
else
  CMD+=" && $TF_TPU"
fi
CMD+=" && $LINK"
run gcloud compute tpus tpu-vm ssh "$TPU_NAME" "--zone=$ZONE" --worker=all "${extra[@]}" "--command=$CMD"
