#!/usr/bin/env bash
# The GPU check of mlip_accel, run from the repository root on a machine with an NVIDIA GPU (the device
# machine: no network; its python3 has torch, cupy, e3nn, pytest). Results go under $OUT (default
# ./gpu_check_out): gpu_tests.log + gpu_junit.xml (every test marked `gpu` in tests/, tests of packages
# absent here skip), memcheck.log and racecheck.log (compute-sanitizer on scripts/sanitizer_case.py),
# kernel_timing.json (scripts/kernel_timing.py). Exit status: non-zero if any stage failed.
#
#   bash scripts/gpu_check.sh [--no-timing] [--no-sanitizer] [pytest args...]
set -uo pipefail
OUT=${OUT:-$PWD/gpu_check_out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
export MLIP_ACCEL_CACHE_DIR=${MLIP_ACCEL_CACHE_DIR:-/tmp/mlip_accel_cache}
timing=1 sanitizer=1
while [[ $# -gt 0 ]]; do
  case $1 in
    --no-timing) timing=0; shift ;;
    --no-sanitizer) sanitizer=0; shift ;;
    *) break ;;
  esac
done
status=0

# mlip_accel is pure Python: install this tree (no dependencies, no network) into a target folder.
SITE=/tmp/mlip_accel_site
if python3 -m pip install -q --no-deps --no-build-isolation --no-index --upgrade --target "$SITE" . \
    >"$OUT/pip.log" 2>&1; then
  export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
else
  echo "pip install failed (see pip.log); importing mlip_accel from the working tree"
  export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
fi
{
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python3 -c "import torch, cupy, e3nn; from cupy_backends.cuda.libs import nvrtc; \
print('torch', torch.__version__, 'cupy', cupy.__version__, 'e3nn', e3nn.__version__, 'nvrtc', nvrtc.getVersion())"
} 2>&1 | tee "$OUT/environment.txt"

# Warm the kernel cache with all cores (the tests then load instead of compiling one by one).
problems=$(ls ../shared/bench/problems.json benchmarks/problems.json 2>/dev/null | head -1)
if [[ -n "$problems" ]]; then
  timeout 100 python3 -m mlip_accel.runtime.precompile "$problems" 2>&1 | tee "$OUT/precompile.log"
fi

(cd tests && timeout 300 python3 -m pytest -m gpu -q -rfEs -p no:cacheprovider --continue-on-collection-errors \
  --junitxml="$OUT/gpu_junit.xml" "$@" . 2>&1) | tee "$OUT/gpu_tests.log"
[[ ${PIPESTATUS[0]} -eq 0 ]] || status=1

if [[ $timing -eq 1 ]]; then
  timeout 100 python3 scripts/kernel_timing.py --out "$OUT" 2>&1 | tee "$OUT/kernel_timing.log"
  [[ ${PIPESTATUS[0]} -eq 0 ]] || status=1
fi

if [[ $sanitizer -eq 1 ]]; then
  if command -v compute-sanitizer >/dev/null; then
    for tool in memcheck racecheck; do
      # without PyTorch's caching allocator every tensor is its own allocation: memcheck sees overruns
      PYTORCH_NO_CUDA_MEMORY_CACHING=1 timeout 80 compute-sanitizer --tool "$tool" --error-exitcode 3 \
        python3 scripts/sanitizer_case.py 2>&1 | tee "$OUT/$tool.log"
      [[ ${PIPESTATUS[0]} -eq 0 ]] || status=1
    done
  else
    echo "compute-sanitizer not found: sanitizer stage skipped" | tee "$OUT/memcheck.log"
    status=1
  fi
fi
echo "gpu_check: $([[ $status -eq 0 ]] && echo PASSED || echo FAILED)" | tee "$OUT/summary.txt"
exit $status
