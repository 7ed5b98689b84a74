#!/usr/bin/env bash
# Cold compile with programs compiled together in threads, and the MLIP_ACCEL_FAST_COMPILE flag, on the device
# machine (16 cores, GPU), in one device call (under 600 s) from the repository root with the device machine's
# python3. Results under $OUT (default ./gpu_check_compile_time_out):
#   setup.log                      GPU, CPU count, versions
#   compile_time.jsonl             scripts/compile_time.py: cold compile per problem and dtype on 16 threads,
#                                  default options then MLIP_ACCEL_FAST_COMPILE=1 (NVRTC --Ofast-compile=min)
#   default/, fast/                scripts/kernel_timing.py (fwd / bwd / double backward ms, rel err vs e3nn) with
#                                  default options and with MLIP_ACCEL_FAST_COMPILE=1: is the faster compile's
#                                  SASS as fast and as correct?
#   gpu_tests_fast.log             tests/test_cuda_kernels.py with MLIP_ACCEL_FAST_COMPILE=1
#   summary.txt                    PASSED/FAILED per stage
# Exit status: non-zero if any stage failed.
#
#   OUT=/path bash scripts/gpu_check_compile_time.sh
set -uo pipefail
OUT=${OUT:-$PWD/gpu_check_compile_time_out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}  # mlip_accel is pure Python: this working tree
: >"$OUT/summary.txt"
source "$(dirname "${BASH_SOURCE[0]}")/gpu_stages.sh"  # stage NAME STATUS; status
{
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  nproc
  python3 -c "import torch, cupy; from cupy_backends.cuda.libs import nvrtc; \
print('torch', torch.__version__, 'cupy', cupy.__version__, 'nvrtc', nvrtc.getVersion())"
  git log -1 --format='tree at %h %s' 2>/dev/null || true
} 2>&1 | tee "$OUT/setup.log"

# 16 threads only: NVRTC 13.0 answers a source already compiled on the machine (even by another process) in ~0.1 s,
# so a second pass over the same sources (1 thread) would time that answer (benchmarks/compile_time.md, last section)
timeout 150 python3 scripts/compile_time.py --threads 16 --out "$OUT/compile_time.jsonl" 2>&1 | tail -n 20
stage compile_time_default ${PIPESTATUS[0]}
MLIP_ACCEL_FAST_COMPILE=1 timeout 100 python3 scripts/compile_time.py --threads 16 --out "$OUT/compile_time.jsonl" \
  2>&1 | tail -n 20
stage compile_time_fast ${PIPESTATUS[0]}

for mode in default fast; do
  mkdir -p "$OUT/$mode"
  fast=$([[ $mode == fast ]] && echo 1 || echo 0)
  MLIP_ACCEL_FAST_COMPILE=$fast MLIP_ACCEL_CACHE_DIR=/tmp/mlip_accel_cache_$mode timeout 110 \
    python3 scripts/kernel_timing.py --e3nn "" --workers 16 --out "$OUT/$mode" >"$OUT/$mode/kernel_timing.log" 2>&1
  stage kernel_timing_$mode $?
done

(cd tests && MLIP_ACCEL_FAST_COMPILE=1 MLIP_ACCEL_CACHE_DIR=/tmp/mlip_accel_cache_fast timeout 100 \
  python3 -m pytest -m gpu -q -rfEs -p no:cacheprovider test_cuda_kernels.py) >"$OUT/gpu_tests_fast.log" 2>&1
stage gpu_tests_fast $?
cat "$OUT/summary.txt"
exit $status
