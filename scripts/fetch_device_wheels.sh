#!/usr/bin/env bash
# Download (here, where PyPI is reachable) every Python package the GPU device machine lacks for the
# peer benchmarks and the framework runs, into .whl/ at the repository root (git-ignored), for the
# device's CPython 3.12 on x86-64 Linux. scripts/device_env.sh installs them there, offline.
#
#   .whl/common/  wheels both framework environments use (ase, vesin, matscipy, cuEquivariance's python
#                 parts, OpenEquivariance repacked as a wheel, ...)
#   .whl/nequip/  nequip 0.19.1 and e3nn 0.6.0 (+ hydra); .whl/mace/  mace-torch 0.3.16 and e3nn 0.4.4 (+ ...)
#   .whl/torchsim/  torch-sim-atomistic 0.6.2 and what it imports that the device lacks (tables, blosc2, ...)
#   .whl/symmetrix/ Symmetrix-XL 0.1.1 (the python frontend and its CUDA 13 / sm_90 native backend, ~37 MB):
#                 a MACE peer for scripts/bench_md_sweep.py. Together with the rest .whl/ may exceed what one
#                 device call carries (64 MiB): scripts/gpu_check_graphs_sweep.sh names what it needs.
#   .whl/cueq_ops_cu13.tar.xz  cuEquivariance's two compiled cu13 wheels, unzipped and xz-packed: zipped
#                 they are 74 MB, more than the 64 MiB the device call may carry; xz brings them to ~30 MB.
#
# What the device image already has (torch 2.11, numpy, scipy, lightning, h5py, pandas, ...; see the
# device docs' package list) is not fetched. Idempotent: files already present are kept.
# Usage: bash scripts/fetch_device_wheels.sh [--force]   (--force re-creates .whl/ from scratch)
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
DEST=$ROOT/.whl
PY=${PYTHON:-python3}
[[ "${1:-}" == "--force" ]] && rm -rf "$DEST"
mkdir -p "$DEST"/{common,nequip,mace,torchsim,symmetrix}

PLATFORM_ARGS=(--only-binary=:all: --python-version 3.12 --implementation cp --abi cp312 --abi abi3 --abi none
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64
  --platform linux_x86_64 --platform any)

have() {  # have DIR NAME VERSION: is a wheel of NAME==VERSION already in DIR?
  local norm; norm=$(echo "$2" | tr 'A-Z-.' 'a-z__')
  compgen -G "$1/${norm}-$3-*.whl" >/dev/null || compgen -G "$1/$(echo "$2" | tr '-' '_')-$3-*.whl" >/dev/null
}

fetch() {  # fetch DIR NAME==VERSION...: binary wheels for the device, no dependencies (named explicitly)
  local dir=$1; shift
  local want=()
  for spec in "$@"; do have "$dir" "${spec%%==*}" "${spec##*==}" || want+=("$spec"); done
  ((${#want[@]})) || return 0
  "$PY" -m pip download -q --no-deps "${PLATFORM_ARGS[@]}" -d "$dir" "${want[@]}"
}

build_pure() {  # build_pure DIR NAME==VERSION: pure-python packages published only as sdists
  local dir=$1 spec=$2
  have "$dir" "${spec%%==*}" "${spec##*==}" && return 0
  "$PY" -m pip wheel -q --no-deps --no-binary=:all: -w "$dir" "$spec"
}

# --- shared by both environments -----------------------------------------------------------------
fetch "$DEST/common" ase==3.29.0 vesin==0.6.2 matscipy==1.3.1 lmdb==3.0.0 platformdirs==4.14.7 \
  cuequivariance==0.13.0 cuequivariance-torch==0.13.0

# --- NequIP: nequip 0.19.1 needs e3nn>=0.6 and hydra-core -----------------------------------------
fetch "$DEST/nequip" nequip==0.19.1 e3nn==0.6.0 hydra-core==1.3.8 omegaconf==2.3.1
build_pure "$DEST/nequip" antlr4-python3-runtime==4.9.3

# --- MACE: mace-torch 0.3.16 pins e3nn==0.4.4 -----------------------------------------------------
fetch "$DEST/mace" mace-torch==0.3.16 e3nn==0.4.4 torch-ema==0.3 prettytable==3.18.0 wcwidth==0.9.4 \
  ConfigArgParse==1.9.0 GitPython==3.2.1 gitdb==4.0.12 smmap==5.0.3 orjson==3.13.0
build_pure "$DEST/mace" python-hostlist==2.3.0

# --- TorchSim 0.6.2 (scripts/bench_torchsim.py), both environments. Its optional GPU neighbour list
# (nvalchemi-toolkit-ops) is left out: it needs warp-lang, a 149 MB wheel, more than a device call carries;
# torch_sim then uses vesin. blosc2 (for tables) needs pydantic; the rest of its needs are on the device.
fetch "$DEST/torchsim" torch-sim-atomistic==0.6.2 tables==3.11.1 blosc2==4.14.1 numexpr==2.14.2 ndindex==1.10.1 \
  pydantic==2.14.3 pydantic-core==2.50.4 annotated-types==0.8.0 typing-inspection==0.4.5

# --- Symmetrix-XL 0.1.1 (scripts/bench_md_sweep.py): pure-python frontend + the native backend built for
# CUDA 13 and sm_90 (H100/H200); its needs (numpy, scipy, ase; mace-torch for the model extraction) are in
# the device image or the MACE environment.
fetch "$DEST/symmetrix" symmetrix-xl==0.1.1 symmetrix-xl-cuda13-sm90==0.1.1

# --- OpenEquivariance 0.7.0: an sdist whose build downloads libtorch; its torch extension can instead be
# JIT-built on first import (OEQ_JIT_EXTENSION=1), so we ship the python package (with the extension's
# C++ sources inside it) as a plain py3 wheel.
if ! have "$DEST/common" openequivariance 0.7.0; then
  tmp=$(mktemp -d)
  "$PY" -m pip download -q --no-deps --no-binary=:all: -d "$tmp" openequivariance==0.7.0
  tar -xzf "$tmp"/openequivariance-0.7.0.tar.gz -C "$tmp"
  "$PY" "$ROOT/scripts/_repack_sdist_as_wheel.py" "$tmp/openequivariance-0.7.0" openequivariance 0.7.0 "$DEST/common"
  rm -rf "$tmp"
fi

# --- cuEquivariance's compiled ops (cu13): unzip both wheels into one tree, drop what no import reads
# (bundled gtest headers/archives, Triton caches for other GPUs), pack with xz.
OPS_TAR=$DEST/cueq_ops_cu13.tar.xz
if [[ ! -f $OPS_TAR ]]; then
  tmp=$(mktemp -d)
  "$PY" -m pip download -q --no-deps "${PLATFORM_ARGS[@]}" -d "$tmp" \
    cuequivariance-ops-cu13==0.13.0 cuequivariance-ops-torch-cu13==0.13.0
  mkdir "$tmp/tree"
  for w in "$tmp"/*.whl; do (cd "$tmp/tree" && "$PY" -m zipfile -e "$w" .); done
  rm -rf "$tmp/tree/include" "$tmp/tree/lib64"
  find "$tmp/tree/cuequivariance_ops/triton/cache" -type f ! -name '*.9.0.json' -delete 2>/dev/null || true
  tar -C "$tmp/tree" -cf - . | xz -T2 -6 > "$OPS_TAR.part"
  mv "$OPS_TAR.part" "$OPS_TAR"
  rm -rf "$tmp"
fi

du -sh "$DEST"/* | sed 's/^/  /'
echo "fetch_device_wheels: done ($(du -sm "$DEST" | cut -f1) MiB in .whl/)"
