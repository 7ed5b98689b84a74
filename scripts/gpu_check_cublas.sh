#!/usr/bin/env bash
# What cuBLAS costs in device memory (cublas_memory_probe.py: its code outside torch's allocator, its workspaces
# inside) and the GPU tests of the MACE paths changed last, on the device machine from the repository root with
# .whl/common and .whl/mace carried. Results under $OUT: summary.txt, cublas_memory_probe.{json,md},
# gpu_tests_mace.log.
#
#   OUT=/path bash scripts/gpu_check_cublas.sh
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/gpu_stages.sh"
gpu_check_start gpu_check_cublas || exit 1
timeout 90 bash -c "py_mace scripts/cublas_memory_probe.py --out $OUT"
stage cublas_memory_probe $?
gpu_tests mace 120 gpu_tests_mace test_mace_lazy_harmonics.py test_describe.py test_graph_cache.py
cat "$OUT/summary.txt"
exit $status
