#!/usr/bin/env bash
# Set up commbench on a fresh Debian machine: Open MPI, a venv in .venv with
# torch 2.13.0 (CPU), mpi4py, numpy, matplotlib, pytest, Holistic Trace Analysis,
# the project (editable) and Horovod 0.28.1 built from source with MPI + Gloo + PyTorch.
#
# Run as root, it also makes the venv's activate script export
# OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1: Open MPI's mpirun
# refuses to run as root without them, so `. .venv/bin/activate` and then
# `mpirun ...` works as the README shows.
#
# Idempotent: a second run installs nothing new; the Horovod wheel is cached
# outside the repo (COMMBENCH_WHEEL_CACHE, default ~/.cache/commbench/wheels)
# so the next set-up installs it in seconds.
#
# Switches (environment variables):
#   COMMBENCH_WITH_NCCL=1   build Horovod with NCCL (needs CUDA + NCCL on the
#                           machine and a CUDA build of torch); GPU users want this.
#   COMMBENCH_TORCH=...     torch requirement (default torch==2.13.0, CPU build).
#   COMMBENCH_SKIP_APT=1    do not touch system packages.
#   COMMBENCH_VENV=PATH     where the venv goes (default .venv in the repo).
#
# Flags:
#   --with-test-deps        also install what only the tests need (a single-node
#                           Slurm: slurm-wlm, munge; a Docker daemon, compose and
#                           debootstrap for the container cluster: docker.io,
#                           docker-compose, debootstrap); `make test` passes it.
set -euo pipefail
TEST_DEPS=0
for arg in "$@"; do
  case "$arg" in
    --with-test-deps) TEST_DEPS=1 ;;
    *) echo "setup.sh: unknown argument $arg" >&2; exit 2 ;;
  esac
done

HOROVOD_VERSION=0.28.1
HTA_VERSION=0.5.0
ROOT=$(cd "$(dirname "$0")/.." && pwd)
VENV=${COMMBENCH_VENV:-$ROOT/.venv}
TORCH_REQ=${COMMBENCH_TORCH:-torch==2.13.0}
CACHE=${COMMBENCH_WHEEL_CACHE:-$HOME/.cache/commbench/wheels}
WITH_NCCL=${COMMBENCH_WITH_NCCL:-0}

log() { printf '[setup] %s\n' "$*" >&2; }

# --- 1. system packages -------------------------------------------------------
apt_pkgs=(openmpi-bin libopenmpi-dev g++ make cmake git iproute2 iptables procps util-linux)
[ "$TEST_DEPS" = 1 ] && apt_pkgs+=(slurm-wlm munge docker.io docker-compose debootstrap)
if [ "${COMMBENCH_SKIP_APT:-0}" != 1 ]; then
  missing=()
  for p in "${apt_pkgs[@]}"; do
    dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
  done
  if [ ${#missing[@]} -gt 0 ]; then
    log "apt-get install ${missing[*]}"
    SUDO=; [ "$(id -u)" = 0 ] || SUDO=sudo
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  fi
fi
command -v mpicc >/dev/null || { log "mpicc not found: install Open MPI (openmpi-bin libopenmpi-dev)"; exit 1; }

# --- 2. virtual environment ----------------------------------------------------
if [ ! -x "$VENV/bin/python" ]; then
  log "creating venv $VENV"
  python3 -m venv "$VENV"
fi
PY="$VENV/bin/python"
PIP=("$PY" -m pip --disable-pip-version-check -q)
if [ "$(id -u)" = 0 ] && ! grep -q OMPI_ALLOW_RUN_AS_ROOT "$VENV/bin/activate"; then
  cat >> "$VENV/bin/activate" <<'EOF'

# Added by commbench's scripts/setup.sh (run as root): Open MPI's mpirun refuses
# to run as root unless both are set.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
EOF
  log "root: $VENV/bin/activate now exports OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 for mpirun"
fi
# Python packages are reinstalled only when what asks for them changed.
stamp="$VENV/.commbench-setup"
want=$(cat "$ROOT/pyproject.toml" | sha256sum | cut -c1-16)-$TORCH_REQ
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  "${PIP[@]}" install --upgrade pip setuptools wheel >/dev/null
  if ! "$PY" -c "import torch" 2>/dev/null; then
    log "installing $TORCH_REQ"
    "${PIP[@]}" install "$TORCH_REQ"
  fi
  log "installing project (editable) with test extras"
  "${PIP[@]}" install -e "$ROOT[test]"
  # Holistic Trace Analysis reads --trace torch's traces (tests/test_torch_trace.py); its
  # requirements are in the test extras but for jupyterlab (its notebooks only), so no deps
  # here; it requires no torch, so torch stays as installed
  "${PIP[@]}" install --no-deps "HolisticTraceAnalysis==$HTA_VERSION"
  echo "$want" > "$stamp"
else
  log "python packages up to date ($VENV)"
fi

# --- 3. Horovod ---------------------------------------------------------------
torch_ver=$("$PY" -c "import torch; print(torch.__version__.replace('+', '_'))")
flavour=cpu; [ "$WITH_NCCL" = 1 ] && flavour=nccl
# Horovod's own requirements: its wheel goes in with --no-deps (so pip never tries to
# build another Horovod), and without cffi pip's resolver prints an ERROR on every install.
HOROVOD_DEPS=(cffi cloudpickle packaging psutil pyyaml)
wheel_dir="$CACHE/horovod-$HOROVOD_VERSION-torch$torch_ver-py$("$PY" -c 'import sys;print(f"{sys.version_info[0]}{sys.version_info[1]}")')-$flavour"

have_horovod() {
  "$PY" - <<'PY' 2>/dev/null
import sys
import horovod, horovod.torch as hvd
sys.exit(0 if horovod.__version__ == "0.28.1" and hvd.mpi_built() and hvd.gloo_built() else 1)
PY
}

if have_horovod && { [ "$WITH_NCCL" != 1 ] || "$PY" -c "import horovod.torch as h,sys;sys.exit(0 if h.nccl_built() else 1)"; }; then
  log "horovod $HOROVOD_VERSION already installed"
else
  if ! ls "$wheel_dir"/horovod-*.whl >/dev/null 2>&1; then
    log "building horovod $HOROVOD_VERSION ($flavour) from source; ~10 min on 2 cores"
    build=$(mktemp -d)
    trap 'rm -rf "$build"' EXIT
    "${PIP[@]}" download "horovod==$HOROVOD_VERSION" --no-deps --no-binary :all: -d "$build"
    tar xzf "$build/horovod-$HOROVOD_VERSION.tar.gz" -C "$build"
    src="$build/horovod-$HOROVOD_VERSION"
    # torch >= 2.1 headers need C++17; Horovod 0.28.1 as released asks for C++14.
    sed -i 's/set(CMAKE_CXX_STANDARD 14)/set(CMAKE_CXX_STANDARD 17)/' \
      "$src/CMakeLists.txt" "$src/horovod/torch/CMakeLists.txt"
    grep -q 'CMAKE_CXX_STANDARD 17' "$src/horovod/torch/CMakeLists.txt" \
      || { log "C++17 patch did not apply to horovod/torch/CMakeLists.txt"; exit 1; }
    export HOROVOD_WITH_PYTORCH=1 HOROVOD_WITH_MPI=1 HOROVOD_WITH_GLOO=1 \
           HOROVOD_WITHOUT_TENSORFLOW=1 HOROVOD_WITHOUT_MXNET=1
    if [ "$WITH_NCCL" = 1 ]; then
      export HOROVOD_GPU_OPERATIONS=NCCL
    else
      export HOROVOD_CPU_OPERATIONS=MPI
      unset HOROVOD_GPU_OPERATIONS || true
    fi
    # Gloo's old cmake_minimum_required is refused by cmake >= 4 (pip's cmake).
    export CMAKE_POLICY_VERSION_MINIMUM=3.5
    export MAKEFLAGS="-j$(nproc)"
    "${PIP[@]}" install "${HOROVOD_DEPS[@]}"
    mkdir -p "$wheel_dir"
    "$PY" -m pip wheel --no-build-isolation --no-deps -w "$build/dist" "$src"
    cp "$build"/dist/horovod-*.whl "$wheel_dir/"
  fi
  log "installing cached wheel from $wheel_dir"
  "${PIP[@]}" install "${HOROVOD_DEPS[@]}"  # first, so installing the wheel finds them
  "${PIP[@]}" install --force-reinstall --no-deps "$wheel_dir"/horovod-*.whl
fi
# Also for a venv whose Horovod came before cffi was on the list (quick when present).
"$PY" -c "import cffi, cloudpickle, packaging, psutil, yaml" 2>/dev/null \
  || "${PIP[@]}" install "${HOROVOD_DEPS[@]}"

# --- 4. check -------------------------------------------------------------------
check=$("$VENV/bin/horovodrun" --check-build)
printf '%s\n' "$check" >&2
for fw in PyTorch MPI Gloo; do
  printf '%s\n' "$check" | grep -Eq "\[X\] $fw" \
    || { log "horovodrun --check-build does not list $fw"; exit 1; }
done
log "ready: $VENV"
