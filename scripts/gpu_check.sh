#!/usr/bin/env bash
# The GPU check of mlip_accel, run from the repository root on a machine with an NVIDIA GPU (the device
# machine: no network; its python3 has torch, cupy, e3nn, pytest). Results go under $OUT (default
# ./gpu_check_out):
#   setup.log        GPU, versions, install, kernel-cache precompile
#   gpu_tests.log, gpu_junit.xml   every test marked `gpu` in tests/ (tests of packages absent here skip)
#   kernel_timing.log, kernel_timing.json   scripts/kernel_timing.py (carbon-1k-size random graph)
#   sanitizer.log    compute-sanitizer memcheck and racecheck on scripts/sanitizer_case.py
#   ncu.txt          (--profile) Nsight Compute sections of the mace-large fp32 forward/backward kernels
#   summary.txt      PASSED/FAILED per stage
# Exit status: non-zero if any stage failed.
#
#   bash scripts/gpu_check.sh [--no-timing] [--no-sanitizer] [--profile] [pytest args...]
set -uo pipefail
OUT=${OUT:-$PWD/gpu_check_out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
export MLIP_ACCEL_CACHE_DIR=${MLIP_ACCEL_CACHE_DIR:-/tmp/mlip_accel_cache}
timing=1 sanitizer=1 profile=0
while [[ $# -gt 0 ]]; do
  case $1 in
    --no-timing) timing=0; shift ;;
    --no-sanitizer) sanitizer=0; shift ;;
    --profile) profile=1; shift ;;
    *) break ;;
  esac
done
: >"$OUT/summary.txt"
source "$(dirname "${BASH_SOURCE[0]}")/gpu_stages.sh"  # stage NAME STATUS; status

{
  # mlip_accel is pure Python: install this tree (no dependencies, no network) into a target folder.
  SITE=/tmp/mlip_accel_site
  if python3 -m pip install -q --no-deps --no-build-isolation --no-index --upgrade --target "$SITE" . 2>&1; then
    echo "installed into $SITE"
  else
    echo "pip install failed: importing mlip_accel from the working tree"
    SITE=$PWD
  fi
  echo "$SITE" >"$OUT/.site"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python3 -c "import torch, cupy, e3nn; from cupy_backends.cuda.libs import nvrtc; \
print('torch', torch.__version__, 'cupy', cupy.__version__, 'e3nn', e3nn.__version__, 'nvrtc', nvrtc.getVersion())"
} 2>&1 | tee "$OUT/setup.log"
export PYTHONPATH="$(cat "$OUT/.site")${PYTHONPATH:+:$PYTHONPATH}"
rm -f "$OUT/.site"

# Warm the kernel cache with all cores (the tests then load instead of compiling one by one).
problems=$(ls ../shared/bench/problems.json benchmarks/problems.json 2>/dev/null | head -1)
if [[ -n "$problems" ]]; then
  timeout 100 python3 -m mlip_accel.runtime.precompile "$problems" 2>&1 | tee -a "$OUT/setup.log"
fi

(cd tests && timeout 300 python3 -m pytest -m gpu -q -rfEs -p no:cacheprovider --continue-on-collection-errors \
  --junitxml="$OUT/gpu_junit.xml" "$@" . 2>&1) | tee "$OUT/gpu_tests.log"
stage "gpu tests" "${PIPESTATUS[0]}"

if [[ $timing -eq 1 ]]; then
  timeout 100 python3 scripts/kernel_timing.py --out "$OUT" 2>&1 | tee "$OUT/kernel_timing.log"
  stage "timing" "${PIPESTATUS[0]}"
fi

if [[ $sanitizer -eq 1 ]]; then
  : >"$OUT/sanitizer.log"
  for tool in ${SANITIZER_TOOLS:-memcheck racecheck}; do
    if command -v compute-sanitizer >/dev/null; then
      # without PyTorch's caching allocator every tensor is its own allocation: memcheck sees overruns
      PYTORCH_NO_CUDA_MEMORY_CACHING=1 timeout 80 compute-sanitizer --tool "$tool" --error-exitcode 3 \
        python3 scripts/sanitizer_case.py 2>&1 | tee -a "$OUT/sanitizer.log"
      stage "$tool" "${PIPESTATUS[0]}"
    else
      stage "$tool (compute-sanitizer not found)" 1
    fi
  done
fi

if [[ $profile -eq 1 ]]; then
  # the second round of mace-large fp32 (the first compiles and warms up): forward walk, backward walk
  timeout 120 ncu --launch-skip 2 --launch-count 2 -k 'regex:mla_conv_det_(for|bac_xyw)_f32$' \
    --section SpeedOfLight --section LaunchStats --section Occupancy --section MemoryWorkloadAnalysis \
    --section WarpStateStats --section SchedulerStats --section ComputeWorkloadAnalysis \
    python3 scripts/kernel_timing.py --once mace-large:float32 >"$OUT/ncu.txt" 2>&1
  stage "ncu profile" $?
  grep -E "mla_conv|Duration|Memory Throughput|DRAM Throughput|L1/TEX Hit|L2 Hit|Achieved Occupancy|Registers Per|Theoretical Occ|Issue Slots Busy|No Eligible|Compute \(SM\)|Executed Ipc A" "$OUT/ncu.txt" | head -60
fi
echo "gpu_check: $([[ $status -eq 0 ]] && echo PASSED || echo FAILED)" | tee -a "$OUT/summary.txt"
exit $status
