#!/usr/bin/env bash
# The conv's fused double backward (issue 15) on a GPU, in one device call (under 600 s) from the repository
# root, with the device machine's python3 (torch, cupy, e3nn, pytest; nothing to install). Results under $OUT
# (default ./gpu_check_double_out):
#   setup.log                      GPU, versions; the kernels below compiled in parallel first (disk cache)
#   gpu_tests.log, gpu_junit.xml   tests/test_double_backward_gpu.py (the fused walks vs the composed reference:
#                                  every problem, random problems, each subset of incoming gradients, graphs,
#                                  bitwise reproducibility, op vs composed, memory) and the double-backward and
#                                  opcheck tests of tests/test_cuda_kernels.py (module autograd through the op)
#   sanitizer.log                  compute-sanitizer memcheck and racecheck on scripts/sanitizer_case.py --only double
#                                  (hub, isolated nodes, one edge, no edges; det and atomic; fp32 and fp64)
#   double_backward.json, .md      scripts/double_backward_timing.py: fused vs composed time and peak memory,
#                                  mace-large, mace-medium, nequip-benzene, fp32 and fp64, cold compile of the walks;
#                                  forward, backward, fused double backward unrolled vs chunk loops (det)
#   summary.txt                    PASSED/FAILED per stage
# Exit status: non-zero if any stage failed.
#
#   OUT=/path bash scripts/gpu_check_double.sh
set -uo pipefail
OUT=${OUT:-$PWD/gpu_check_double_out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}  # mlip_accel is pure Python: this working tree
export MLIP_ACCEL_CACHE_DIR=${MLIP_ACCEL_CACHE_DIR:-/tmp/mlip_accel_cache}
PROBLEMS=${PROBLEMS:-mace-large,mace-medium,nequip-benzene}
: >"$OUT/summary.txt"
source "$(dirname "${BASH_SOURCE[0]}")/gpu_stages.sh"  # stage NAME STATUS; status

{
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python3 -c "import torch, cupy, e3nn; from cupy_backends.cuda.libs import nvrtc; \
print('torch', torch.__version__, 'cupy', cupy.__version__, 'e3nn', e3nn.__version__, 'nvrtc', nvrtc.getVersion())"
  git log -1 --format='tree at %h %s' 2>/dev/null || true
} 2>&1 | tee "$OUT/setup.log"

# What the tests and timings load, compiled first in parallel processes (disk cache): the fused walks of every
# problem of problems.json; every kernel of the timed problems (the composed path's too); their walks with chunk
# loops.
timeout 120 python3 scripts/double_backward_timing.py --precompile --problems "$PROBLEMS" 2>&1 | tee -a "$OUT/setup.log"
stage precompile "${PIPESTATUS[0]}"

(cd tests && timeout 160 python3 -m pytest -m gpu -q -rfEs -p no:cacheprovider --junitxml="$OUT/gpu_junit.xml" \
  test_double_backward_gpu.py "test_cuda_kernels.py::test_conv_double_backward_matches_reference" \
  "test_cuda_kernels.py::test_opcheck_cuda" 2>&1) | tee "$OUT/gpu_tests.log" | tail -25
stage "gpu tests" "${PIPESTATUS[0]}"

: >"$OUT/sanitizer.log"
# once without the sanitizer: compiles the case's kernels into the disk cache and checks its results quickly
timeout 30 python3 scripts/sanitizer_case.py --only double 2>&1 | tee -a "$OUT/sanitizer.log" | tail -2
stage "sanitizer case (plain run)" "${PIPESTATUS[0]}"
for tool in memcheck racecheck; do
  if command -v compute-sanitizer >/dev/null; then
    # without PyTorch's caching allocator every tensor is its own allocation: memcheck sees overruns
    PYTORCH_NO_CUDA_MEMORY_CACHING=1 timeout ${SANITIZER_TIMEOUT:-150} compute-sanitizer --tool "$tool" --error-exitcode 3 \
      python3 scripts/sanitizer_case.py --only double 2>&1 | tee -a "$OUT/sanitizer.log" | tail -5
    stage "$tool" "${PIPESTATUS[0]}"
  else
    stage "$tool (compute-sanitizer not found)" 1
  fi
done

timeout 130 python3 scripts/double_backward_timing.py --problems "$PROBLEMS" --chunk-loops --out "$OUT" 2>&1 \
  | tee "$OUT/double_backward_timing.log" | tail -20
stage "fused vs composed timing" "${PIPESTATUS[0]}"

echo "gpu_check_double: $([[ $status -eq 0 ]] && echo PASSED || echo FAILED)" | tee -a "$OUT/summary.txt"
exit $status
