#!/usr/bin/env bash
# One device call for the symmetric contraction's deterministic weight gradients and the whole-step MACE
# benchmark, from the repository root with .whl carried: scripts/gpu_check_symcon.sh with
#   GPU tests      tests/test_symmetric_contraction_gpu.py + test_mace_skip_linear.py (vs reference/e3nn,
#                  bitwise reruns of the weight gradients, ops, CUDA graphs, accelerate())
#   product blocks bench_symcon.py at carbon-8000 fp32: forces / train time and peak memory
#   whole step     bench_mace_step.py (md, train), mlip_accel vs cuEquivariance vs e3nn, 1000 / 8000 / 10648 atoms,
#                  fp32 then fp64 (STEP_ARGS overrides)
# Stage limits 45 + 180 + 75 + 230 s (about 570 s in all; the GPU tests took 157 s on an H100): one call of at most 600 s returns everything.
set -uo pipefail
export OUT=${OUT:-$PWD/gpu_check_symcon_train_out}
export GPU_TESTS="test_symmetric_contraction_gpu.py test_mace_skip_linear.py"
export BENCH_ARGS="--sizes 8000 --dtypes float32" LIMITS="45 180 75" LIMIT_STEP=230
export STEP_ARGS=${STEP_ARGS:---sizes 5 10 11 --dtypes float32 float64 --time-budget 200}
exec bash "$(dirname "$0")/gpu_check_symcon.sh"
