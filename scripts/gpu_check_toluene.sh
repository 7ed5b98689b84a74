#!/usr/bin/env bash
# Issue 15: nequip-toluene's fp32 backward at carbon-8k (0.98x cuEquivariance, benchmarks/atomic_order_25th.md):
# walk_ab.py --what gysum and --what loops on PROBLEMS (default nequip-toluene) at GRAPH (default carbon-8k), fp32,
# L2 warm, ROUNDS rounds. From the repository root with .whl/common and .whl/nequip carried. Results under $OUT:
# <what>/walk_ab_<what>.{json,md}, summary.txt.
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/gpu_stages.sh"
gpu_check_start gpu_check_toluene || exit 1
for what in ${WHATS:-gysum loops}; do
  timeout "${AB_TIMEOUT:-150}" bash -c "py_nequip scripts/walk_ab.py --what $what --problems ${PROBLEMS:-nequip-toluene} \
    --dtypes float32 --graph ${GRAPH:-carbon-8k} --rounds ${ROUNDS:-3} --out $OUT/$what" >"$OUT/$what.log" 2>&1
  stage "walk_ab $what" $?
  grep "^|" "$OUT/$what/walk_ab_$what.md" 2>/dev/null || tail -n 5 "$OUT/$what.log"
done
cat "$OUT/summary.txt"
exit $status
