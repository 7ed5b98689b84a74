#!/usr/bin/env bash
# A code change without a tuning switch, timed against the package it replaces: scripts/walk_ab.py (WALK_ARGS; one
# setting, e.g. --what prefetch --levels L2, the default hints) run in alternating processes, ROUNDS times each, with
# the package of this checkout ("new") and with the one under BASE ("base": a copy of another commit's mlip_accel/,
# e.g. `git worktree add /tmp/base <rev> && cp -r /tmp/base/mlip_accel ab_base/`), so drifts of clocks and
# temperature fall on both. From the repository root on the device machine, .whl/common and .whl/nequip carried.
# Results under $OUT: <label>_<n>/walk_ab_*.{json,md}; the tables on stdout.
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/gpu_stages.sh"
gpu_check_start gpu_ab_checkouts || exit 1
BASE=${BASE:-ab_base}
[[ -d $BASE/mlip_accel ]] || { echo "no package under $BASE/mlip_accel"; exit 2; }
for n in $(seq 1 "${ROUNDS:-2}"); do
  for label in base new; do
    path=$([[ $label == base ]] && echo "$PWD/$BASE:" || echo "")
    timeout "${AB_TIMEOUT:-120}" env PYTHONPATH="$path$MLIP_PYTHONPATH_NEQUIP" python3 scripts/walk_ab.py \
      ${WALK_ARGS:---what prefetch --levels L2 --problems mace-medium --dtypes float32 --graph carbon-8k} \
      --out "$OUT/${label}_$n" >"$OUT/${label}_$n.log" 2>&1
    stage "$label round $n" $?
    echo "## $label, round $n"
    grep "^| [a-z]" "$OUT/${label}_$n"/walk_ab_*.md 2>/dev/null | grep -v "^| problem" || tail -n 5 "$OUT/${label}_$n.log"
  done
done
cat "$OUT/summary.txt"
exit $status
