#!/usr/bin/env bash
# Issue 15's cold compile with first-use stand-ins (runtime.first_use; benchmarks/first_use_22nd.md): what the first
# forward, backward and double backward wait for, per problem and dtype on the host's cores (scripts/compile_time.py
# --by-direction, fresh sources), with stand-ins and without (MLIP_ACCEL_STAND_IN=0); then the first-use GPU tests
# and, unless SKIP_PEERS=1, the NequIP problems against their peers (bench_kernels.py, PEER_ARGS). From the repository
# root with .whl/common, .whl/nequip (and .whl/cueq_ops_cu13.tar.xz for the peers) carried. Results under $OUT:
# compile_{on,off}.jsonl, tests.log, bench/kernels.{json,md}, summary.txt.
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/gpu_stages.sh"
gpu_check_start gpu_check_first_use || exit 1
THREADS=$(nproc)
PROBLEMS=${PROBLEMS:-nequip-benzene,nequip-toluene,mace-large}
for mode in off on; do  # off first: the on run compiles the modules too (in the background)
  value=$([[ $mode == on ]] && echo 1 || echo 0)
  MLIP_ACCEL_STAND_IN=$value timeout 300 bash -c "py_nequip scripts/compile_time.py --by-direction --threads $THREADS \
    --problems $PROBLEMS --dtypes float32,float64 --out $OUT/compile_$mode.jsonl" >"$OUT/compile_$mode.log" 2>&1
  stage "first use, stand-ins $mode" $?
done
py_nequip - "$OUT" <<'PY'
import json, sys
rows = {m: [json.loads(l) for l in open(f"{sys.argv[1]}/compile_{m}.jsonl")] for m in ("on", "off")}
print("| problem | dtype | stand-ins | first use fwd / bwd / double s, stand-ins | without | modules compiled s |")
print("|---|---|---|---|---|---|")
for on, off in zip(rows["on"], rows["off"]):
    a, b = on["by_direction_wall_s"], off["by_direction_wall_s"]
    print(f"| {on['problem']} | {on['dtype']} | {','.join(on['stand_ins']) or '-'} | "
          f"{a['forward']} / {a['backward']} / {a['double']} | {b['forward']} / {b['backward']} / {b['double']} | "
          f"{on.get('modules_compiled_s', '-')} |")
PY
gpu_tests nequip "${TESTS_TIMEOUT:-150}" tests ${TESTS:-test_first_use_gpu.py test_split_walks_gpu.py}
if [[ ${SKIP_PEERS:-0} != 1 ]]; then
  timeout $(( ${BENCH_BUDGET:-240} + 60 )) bash -c "py_nequip scripts/bench_kernels.py --no-compile-time \
    ${PEER_ARGS:---problem-names nequip-toluene,nequip-oam-l,nequip-benzene --graphs carbon-1k --dtypes float32 --impls mlip_accel-det,cueq-uniform_1d,oeq-det} \
    --time-budget ${BENCH_BUDGET:-240} --out $OUT/bench" >"$OUT/bench.log" 2>&1
  stage bench_kernels $?
  grep "^|" "$OUT/bench/kernels.md" 2>/dev/null | head -40
fi
cat "$OUT/summary.txt"
exit $status
