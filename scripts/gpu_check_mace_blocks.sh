#!/usr/bin/env bash
# One device call (issue 14), from the repository root with .whl/common .whl/mace .whl/cueq_ops_cu13.tar.xz carried:
#   gpu tests   the MACE radial MLP's kernels (silu'' fused, 3xTF32 last layer) and the skip linear's
#   blocks      scripts/bench_mace_blocks.py: per-block breakdown at 8000 atoms, e3nn / cuEquivariance / mlip_accel,
#               fp32 and fp64 (BLOCK_ARGS overrides)
# Writes summary.txt (PASSED/FAILED per stage), gpu_tests.log, bench_mace_blocks.{json,md} under $OUT.
set -uo pipefail
OUT=${OUT:-$PWD/gpu_check_mace_blocks_out}
mkdir -p "$OUT"
source scripts/device_env.sh > "$OUT/setup.log" 2>&1 || { echo "setup: FAILED" >> "$OUT/summary.txt"; exit 1; }
skip_oeq_build  # OpenEquivariance's JIT build hangs device calls
GPU_TESTS=${GPU_TESTS:-"test_silu_kernels.py test_split_matmul.py test_mace_radial_fold.py test_element_linear_kernel.py"}
BLOCK_ARGS=${BLOCK_ARGS:---cells 10 --dtypes float32 float64}
(cd tests && timeout 180 bash -c "py_mace -m pytest -q -p no:cacheprovider -m gpu $GPU_TESTS" > "$OUT/gpu_tests.log" 2>&1)
rc=$?; [[ $rc == 0 ]] && echo "gpu tests: PASSED" >> "$OUT/summary.txt" || echo "gpu tests: FAILED ($rc)" >> "$OUT/summary.txt"
timeout 360 bash -c "py_mace scripts/bench_mace_blocks.py --out '$OUT' $BLOCK_ARGS" > "$OUT/blocks.log" 2>&1
rc=$?; [[ $rc == 0 ]] && echo "blocks: PASSED" >> "$OUT/summary.txt" || echo "blocks: FAILED ($rc)" >> "$OUT/summary.txt"
cat "$OUT/summary.txt"
