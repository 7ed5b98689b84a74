#!/usr/bin/env bash
# Issue 15 after the prefetch hints (benchmarks/prefetch_hints.md): the MACE problems' convolution against
# cuEquivariance in one run (scripts/bench_kernels.py: forward, backward, double backward, peak memory), then the
# bench problems' kernel GPU tests. From the repository root with .whl/common, .whl/nequip and
# .whl/cueq_ops_cu13.tar.xz carried (~9 minutes). Results under $OUT: bench/kernels.{json,md}, gpu_tests.log,
# summary.txt. BENCH_ARGS replaces the bench selection; BENCH_BUDGET (s, default 380); TESTS / TESTS_TIMEOUT.
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/gpu_stages.sh"
gpu_check_start gpu_check_prefetch_peers || exit 1
timeout $(( ${BENCH_BUDGET:-380} + 60 )) bash -c "py_nequip scripts/bench_kernels.py --no-compile-time \
  ${BENCH_ARGS:---problem-names mace-medium,mace-large --graphs carbon-1k,carbon-8k --dtypes float32 --impls mlip_accel-det,cueq-uniform_1d} \
  --time-budget ${BENCH_BUDGET:-380} --out $OUT/bench" >"$OUT/bench.log" 2>&1
stage bench_kernels $?
grep "^|" "$OUT/bench/kernels.md" 2>/dev/null | head -40
# shellcheck disable=SC2086  # TESTS: pytest arguments
gpu_tests nequip "${TESTS_TIMEOUT:-120}" gpu_tests ${TESTS:-test_cuda_kernels.py -k mace}
cat "$OUT/summary.txt"
exit $status
