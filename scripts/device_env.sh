# Source this on the GPU device machine, from the repository root, with .whl/ carried along
# (made here by scripts/fetch_device_wheels.sh):
#
#     source scripts/device_env.sh || exit 1
#     py_nequip scripts/bench_kernels.py --quick       # NequIP side: e3nn 0.6, nequip, cuEq, OEQ
#     py_mace -c 'import mace; ...'                     # MACE side: e3nn 0.4.4, mace-torch, cuEq, OEQ
#
# The device image's python3 (torch 2.11+cu130, cupy-cuda13x, ...) is used as it is; what it lacks is
# installed offline into three --target folders (no network there):
#   /tmp/site-common  ase, vesin, matscipy, lmdb, cuEquivariance (+ its compiled cu13 ops), OpenEquivariance
#   /tmp/site-nequip  nequip 0.19.1, e3nn 0.6.0, hydra-core, omegaconf, antlr4
#   /tmp/site-mace    mace-torch 0.3.16, e3nn 0.4.4, torch-ema, prettytable, GitPython, ...
#   /tmp/site-torchsim  torch-sim-atomistic 0.6.2, tables, blosc2, ... (both environments; if .whl/torchsim is there)
#   /tmp/site-symmetrix Symmetrix-XL + its CUDA 13 sm_90 backend (MACE environment, last on its path; if
#                       .whl/symmetrix is there)
# NequIP needs e3nn>=0.6 and mace-torch pins e3nn==0.4.4, hence two PYTHONPATHs. mlip_accel itself is
# imported from this working tree (the repository root goes first on both PYTHONPATHs).
# Idempotent: a second `source` in the same machine reuses the installed folders.

_mlip_dev_root=$(pwd)
if [[ ! -f "$_mlip_dev_root/mlip_accel/__init__.py" || ! -d "$_mlip_dev_root/.whl/common" ]]; then
  echo "device_env.sh: source me from the repository root, with .whl carried (run scripts/fetch_device_wheels.sh here first)" >&2
  return 1 2>/dev/null || exit 1
fi

_mlip_dev_install() {  # _mlip_dev_install TARGET WHEEL_DIR
  local target=$1 wheels=$2
  [[ -f "$target/.installed" ]] && return 0
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$target" \
    "$wheels"/*.whl || return 1
  touch "$target/.installed"
}

_mlip_dev_setup() {
  local t0=$SECONDS
  _mlip_dev_install /tmp/site-common "$_mlip_dev_root/.whl/common" || return 1
  if [[ ! -f /tmp/site-common/.cueq_ops && -f "$_mlip_dev_root/.whl/cueq_ops_cu13.tar.xz" ]]; then
    # cuEquivariance's compiled ops travel unzipped and xz-packed (too large zipped); a wheel is a plain
    # archive of site-packages, so unpacking it into the target is its installation.
    tar -xJf "$_mlip_dev_root/.whl/cueq_ops_cu13.tar.xz" -C /tmp/site-common || return 1
    touch /tmp/site-common/.cueq_ops
  fi
  # a call may carry only one framework's wheels (the 64 MiB limit): install what is there
  if compgen -G "$_mlip_dev_root/.whl/nequip/*.whl" >/dev/null; then
    _mlip_dev_install /tmp/site-nequip "$_mlip_dev_root/.whl/nequip" || return 1
  fi
  if compgen -G "$_mlip_dev_root/.whl/mace/*.whl" >/dev/null; then
    _mlip_dev_install /tmp/site-mace "$_mlip_dev_root/.whl/mace" || return 1
  fi
  if compgen -G "$_mlip_dev_root/.whl/torchsim/*.whl" >/dev/null; then
    _mlip_dev_install /tmp/site-torchsim "$_mlip_dev_root/.whl/torchsim" || return 1
  fi
  if compgen -G "$_mlip_dev_root/.whl/symmetrix/*.whl" >/dev/null; then
    _mlip_dev_install /tmp/site-symmetrix "$_mlip_dev_root/.whl/symmetrix" || return 1
  fi
  echo "device_env.sh: environments ready in $((SECONDS - t0)) s (/tmp/site-{common,nequip,mace})"
}
_mlip_dev_setup || { echo "device_env.sh: installation failed" >&2; return 1 2>/dev/null || exit 1; }

export MLIP_DEVICE_ROOT=$_mlip_dev_root
export MLIP_PYTHONPATH_NEQUIP=$_mlip_dev_root:/tmp/site-nequip:/tmp/site-common:/tmp/site-torchsim
export MLIP_PYTHONPATH_MACE=$_mlip_dev_root:/tmp/site-mace:/tmp/site-common:/tmp/site-torchsim:/tmp/site-symmetrix
# OpenEquivariance ships no extension built for this torch: build it on first import (~40 s, then cached
# under ~/.cache/torch_extensions for the life of the machine).
export OEQ_JIT_EXTENSION=1
export PYTHONUNBUFFERED=1

# For checks that measure no OpenEquivariance: mace-torch imports it when present, and with
# OEQ_JIT_EXTENSION=1 that import JIT-builds its extension (minutes, a lock that outlives a killed build: every
# stage of a call ran into its timeout once). OEQ_NOTORCH=1 imports it without its torch extension.
skip_oeq_build() { export OEQ_NOTORCH=1; unset OEQ_JIT_EXTENSION; }
py_nequip() { PYTHONPATH=$MLIP_PYTHONPATH_NEQUIP${PYTHONPATH:+:$PYTHONPATH} python3 "$@"; }
# e3nn 0.4.4 torch.load()s its constants, refused by torch>=2.6's weights_only default without this.
py_mace() { TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1 PYTHONPATH=$MLIP_PYTHONPATH_MACE${PYTHONPATH:+:$PYTHONPATH} python3 "$@"; }
export -f py_nequip py_mace skip_oeq_build
unset -f _mlip_dev_install _mlip_dev_setup
