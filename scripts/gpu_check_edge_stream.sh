#!/usr/bin/env bash
# GPU check + measurement of edge streaming (issue 18), on the device machine from the repository root with
# .whl carried (scripts/device_env.sh). One device call; results under $OUT:
#   setup.log                                 GPU, versions
#   gpu_tests_{mace,nequip}.log               the @gpu tests of tests/test_{mace,nequip}_edge_stream.py (streamed
#                                             models on the CUDA kernels vs unstreamed and e3nn, fp64 and fp32)
#   edge_stream.{mace,nequip}.json, bench_*.log  scripts/bench_edge_stream.py: time, peak memory, force error of
#                                             stream_edges per chunk size vs the unstreamed model, carbon-1k/8k
#   summary.txt                               PASSED/FAILED per stage
set -uo pipefail
OUT=${OUT:-$PWD/gpu_check_edge_stream_out}
mkdir -p "$OUT"
export MLIP_ACCEL_CACHE_DIR=${MLIP_ACCEL_CACHE_DIR:-/tmp/mlip_accel_cache}
source scripts/device_env.sh >"$OUT/setup.log" 2>&1 || { cat "$OUT/setup.log"; exit 1; }
source "$(dirname "${BASH_SOURCE[0]}")/gpu_stages.sh"  # stage NAME STATUS; status
: >"$OUT/summary.txt"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader >>"$OUT/setup.log" 2>&1

(cd tests && timeout 120 bash -c 'py_mace -m pytest -m gpu -q -rfEs -p no:cacheprovider test_mace_edge_stream.py' 2>&1) \
  | tee "$OUT/gpu_tests_mace.log" | tail -5
stage "gpu tests mace" "${PIPESTATUS[0]}"
(cd tests && timeout 90 bash -c 'py_nequip -m pytest -m gpu -q -rfEs -p no:cacheprovider test_nequip_edge_stream.py' 2>&1) \
  | tee "$OUT/gpu_tests_nequip.log" | tail -5
stage "gpu tests nequip" "${PIPESTATUS[0]}"

# fp32 first (the target), both sizes; chunk sizes: the default budget and two fixed ones
timeout 170 bash -c "py_mace scripts/bench_edge_stream.py --framework mace --sizes 5 10 --dtypes float32 float64 \
  --chunks auto 16384 65536 --min-seconds 0.5 --out '$OUT'" 2>&1 | tee "$OUT/bench_mace.log" | tail -12
stage "bench mace" "${PIPESTATUS[0]}"
timeout 150 bash -c "py_nequip scripts/bench_edge_stream.py --framework nequip --sizes 5 10 --dtypes float32 \
  --chunks auto 16384 --min-seconds 0.5 --out '$OUT'" 2>&1 | tee "$OUT/bench_nequip.log" | tail -8
stage "bench nequip" "${PIPESTATUS[0]}"
cat "$OUT/summary.txt"
exit $status
