#!/usr/bin/env bash
# Build the commbench image from the repository root, with the wheels this
# machine has: the CPU torch wheel and the Horovod wheel scripts/setup.sh
# cached (COMMBENCH_WHEEL_CACHE), copied into docker/wheels/ first.
#
#   docker/build.sh                                  # base debian:bookworm-slim (a registry)
#   docker/build.sh --local-base                     # no registry: debootstrap base (make-base-image.sh)
#   docker/build.sh --base python:3.11-slim-bookworm --tag commbench:dev
#   docker/build.sh --no-wheels                      # download torch, compile Horovod in the build
#   docker/build.sh --compile-horovod                # torch wheel from here, compile Horovod
#   docker/build.sh --no-cache                       # rebuild every layer (docker build --no-cache)
#
# The host's locally added CA certificates (/usr/local/share/ca-certificates/*.crt,
# e.g. a TLS-inspecting proxy's) go to docker/certs/ so pip in the build trusts
# the same servers the host does; --no-host-ca leaves them out.
#
# Environment: PYTHON (a Python whose pip can fetch the torch wheel; default
# .venv/bin/python), TORCH_REQ (default torch==2.13.0+cpu), TORCH_INDEX.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BASE=debian:bookworm-slim
TAG=commbench:latest
WHEELS=1
LOCAL_BASE=0
HOST_CA=1
HOROVOD_WHEEL=1
NO_CACHE=()
while [ $# -gt 0 ]; do
  case "$1" in
    --base) BASE=$2; shift 2 ;;
    --tag) TAG=$2; shift 2 ;;
    --local-base) LOCAL_BASE=1; BASE=commbench-base:bookworm; shift ;;
    --no-wheels) WHEELS=0; shift ;;
    --no-host-ca) HOST_CA=0; shift ;;
    --compile-horovod) HOROVOD_WHEEL=0; shift ;;
    --no-cache) NO_CACHE=(--no-cache); shift ;;
    *) echo "docker/build.sh: unknown argument $1 (see the comment at its top)" >&2; exit 2 ;;
  esac
done
TORCH_REQ=${TORCH_REQ:-torch==2.13.0+cpu}
TORCH_INDEX=${TORCH_INDEX:-https://download.pytorch.org/whl/cpu}
PYTHON=${PYTHON:-$ROOT/.venv/bin/python}
CACHE=${COMMBENCH_WHEEL_CACHE:-$HOME/.cache/commbench/wheels}
# The key scripts/setup.sh files Horovod's wheel under, for the image's torch and
# Python (Debian bookworm: 3.11).
torch_ver=${TORCH_REQ#torch==}
HOROVOD_KEY=horovod-0.28.1-torch${torch_ver//+/_}-py311-cpu

log() { printf '[docker-build] %s\n' "$*" >&2; }

[ "$LOCAL_BASE" = 1 ] && "$ROOT/docker/make-base-image.sh" "$BASE"

certs=$ROOT/docker/certs
wheels=$ROOT/docker/wheels
# What is copied into the build context is removed again afterwards.
clean_context() { find "$certs" "$wheels" -mindepth 1 ! -name README.md -delete; }
clean_context
trap clean_context EXIT
if [ "$HOST_CA" = 1 ] && ls /usr/local/share/ca-certificates/*.crt >/dev/null 2>&1; then
  cp /usr/local/share/ca-certificates/*.crt "$certs/"
  log "trusting the host's local CA certificates: $(cd "$certs" && ls ./*.crt | tr '\n' ' ')"
fi

if [ "$WHEELS" = 1 ]; then
  if [ "$HOROVOD_WHEEL" = 0 ]; then
    log "horovod: compiled in the build (~10 min on 2 cores)"
  elif ls "$CACHE/$HOROVOD_KEY"/horovod-*.whl >/dev/null 2>&1; then
    mkdir -p "$wheels/$HOROVOD_KEY"
    cp "$CACHE/$HOROVOD_KEY"/horovod-*.whl "$wheels/$HOROVOD_KEY/"
    log "horovod wheel from $CACHE/$HOROVOD_KEY"
  else
    log "no cached horovod wheel in $CACHE/$HOROVOD_KEY: the build compiles it (~10 min)"
  fi
  dl=("$PYTHON" -m pip download --no-deps --only-binary :all: --python-version 3.11
      --platform manylinux_2_28_x86_64 -q -d "$wheels" "$TORCH_REQ")
  if "${dl[@]}" 2>/dev/null || "${dl[@]}" --extra-index-url "$TORCH_INDEX" 2>/dev/null; then
    log "torch wheel: $(cd "$wheels" && ls torch-*.whl)"
  else
    log "could not fetch $TORCH_REQ here: the build downloads it from $TORCH_INDEX"
  fi
fi

log "docker build -t $TAG (base $BASE)"
start=$(date +%s)
docker build --force-rm "${NO_CACHE[@]}" -f "$ROOT/docker/Dockerfile" --build-arg "BASE=$BASE" \
  --build-arg "TORCH_REQ=$TORCH_REQ" --build-arg "TORCH_INDEX=$TORCH_INDEX" -t "$TAG" "$ROOT"
log "built $TAG in $(( $(date +%s) - start )) s; $(docker image inspect "$TAG" --format '{{.Size}}') bytes"
