#!/usr/bin/env bash
# One device call for MACE's element-indexed skip linear kernel (codegen.element_linear), from the repository root
# with .whl/common .whl/mace .whl/cueq_ops_cu13.tar.xz carried: scripts/gpu_check_symcon.sh with
#   GPU tests      tests/test_element_linear_kernel.py + test_mace_skip_linear.py (every direction vs the torch
#                  path, NaN rows for an element out of range, e3nn parity, bitwise reruns)
#   product blocks bench_symcon.py at carbon-8000 fp32 (the per-block breakdown of issue 14)
#   whole step     bench_mace_step.py md + train, mlip_accel vs cuEquivariance, 1000 and 8000 atoms, fp32
# Stage limits 45 + 120 + 75 + 270 s: one call of at most 600 s returns everything.
set -uo pipefail
export OUT=${OUT:-$PWD/gpu_check_skip_linear_out}
export GPU_TESTS="test_element_linear_kernel.py test_mace_skip_linear.py"
export BENCH_ARGS="--sizes 8000 --dtypes float32" LIMITS="45 120 75" LIMIT_STEP=270
export STEP_ARGS=${STEP_ARGS:---sizes 5 10 --dtypes float32 --modes md train --impls mlip_accel cueq --time-budget 250}
exec bash "$(dirname "$0")/gpu_check_symcon.sh"
