#!/usr/bin/env bash
# One device call for MACE's whole step after a change outside the kernels (issue 14), from the repository root
# with .whl/common .whl/mace .whl/cueq_ops_cu13.tar.xz carried: scripts/gpu_check_symcon.sh with
#   GPU tests      the MACE swaps' GPU tests (skip linear kernel, folded radial MLP)
#   whole step     bench_mace_step.py md + train, mlip_accel vs cuEquivariance, 1000 / 8000 / 10648 atoms, fp32;
#                  (STEP_ARGS overrides; BENCH_ARGS adds bench_symcon.py's product blocks)
set -uo pipefail
export OUT=${OUT:-$PWD/gpu_check_mace_step_out}
export GPU_TESTS=${GPU_TESTS:-"test_silu_kernels.py test_element_linear_kernel.py test_mace_skip_linear.py test_mace_radial_fold.py"}
export BENCH_ARGS=${BENCH_ARGS:-none} LIMITS="0 120 75" LIMIT_STEP=360
export STEP_ARGS=${STEP_ARGS:---sizes 5 10 11 --dtypes float32 --modes md train --impls mlip_accel cueq --time-budget 340}
exec bash "$(dirname "$0")/gpu_check_symcon.sh"
