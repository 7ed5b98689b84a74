#!/usr/bin/env bash
# Issue 15's in-process A/Bs on the device machine, one loop for every check that runs them: the GPU test files TESTS
# (NequIP environment, if given), then for each WHAT of WHATS and each graph of GRAPHS one run of SCRIPT (default
# scripts/walk_ab.py --what WHAT; ab_atomic_order.py takes --graphs and no --what) on the problems of that graph,
# DTYPES, ROUNDS rounds, LEVELS (walk_ab's --levels) and AB_ARGS, within AB_TIMEOUT seconds each. The problems:
# PROBLEMS_8K at carbon-8k, PROBLEMS_1K at the other graphs (both default PROBLEMS, default mace-medium). From the
# repository root with .whl/common and .whl/nequip carried. Results under $OUT: <what>_<graph>/<script's json and md>,
# <what>_<graph>.log, tests.log, summary.txt.
#
#   WHATS="cap" GRAPHS="carbon-8k carbon-1k" PROBLEMS_8K=mace-medium,nequip-benzene bash scripts/gpu_walk_ab.sh
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/gpu_stages.sh"
gpu_check_start "${CHECK_NAME:-gpu_walk_ab}" || exit 1
# shellcheck disable=SC2086  # TESTS: pytest arguments
[[ -z ${TESTS:-} ]] || gpu_tests nequip "${TESTS_TIMEOUT:-120}" tests $TESTS
script=${SCRIPT:-scripts/walk_ab.py}
for what in ${WHATS:-split}; do
  for graph in ${GRAPHS:-carbon-8k carbon-1k}; do
    problems=$([[ $graph == carbon-8k ]] && echo "${PROBLEMS_8K:-${PROBLEMS:-mace-medium}}" \
               || echo "${PROBLEMS_1K:-${PROBLEMS:-mace-medium}}")
    if [[ $script == *walk_ab.py ]]; then
      args="--what $what --graph $graph ${LEVELS:+--levels $LEVELS}"
    else
      args="--graphs $graph"
    fi
    dir=$OUT/${what}_$graph
    timeout "${AB_TIMEOUT:-200}" bash -c "py_nequip $script $args --problems $problems --dtypes ${DTYPES:-float32} \
      --rounds ${ROUNDS:-3} ${AB_ARGS:-} --out $dir" >"$dir.log" 2>&1
    stage "$(basename "$script" .py) $what $graph" $?
    cat "$dir"/*.md 2>/dev/null | grep "^|" || tail -n 5 "$dir.log"
  done
done
cat "$OUT/summary.txt"
exit $status
