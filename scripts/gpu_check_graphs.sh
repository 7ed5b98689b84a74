#!/usr/bin/env bash
# CUDA graphs for MD on the GPU, in one call: the `gpu` tests of tests/test_cuda_graphs.py (NequIP and MACE
# environments), `mlip-accel md --device cuda` with and without graphs (default model, 256 atoms), and
# scripts/bench_md_graphs.py (MACE-MP-0-medium / NequIP OAM-L size at 32, 216, 1000 atoms). Run from the
# repository root with .whl/ carried (scripts/device_env.sh); results under $OUT:
#   tests_nequip.log, tests_mace.log, graph_report.jsonl   test results and the numbers they record
#   md_cli.log, md_cli.json                                 mlip-accel md steps/s with and without graphs
#   bench_md_graphs.{mace,nequip}.json, bench_md_graphs.{json,md}   the benchmark
#   profile_md_step.jsonl                                   phases of one MD step (scripts/profile_md_step.py)
# PARTS (default: all) picks stages: tests_nequip tests_mace cli bench_nequip bench_mace profile
set -uo pipefail
PARTS=${PARTS:-tests_nequip tests_mace cli bench_nequip bench_mace profile}
want() { [[ " $PARTS " == *" $1 "* ]]; }
export OUT=${OUT:-$PWD/gpu_check_graphs_out}
mkdir -p "$OUT"
source scripts/device_env.sh || exit 1
export MLIP_ACCEL_CACHE_DIR=${MLIP_ACCEL_CACHE_DIR:-/tmp/mlip_accel_cache}
export MLIP_GRAPH_REPORT=$OUT/graph_report.jsonl
export OMP_NUM_THREADS=4
skip_oeq_build
: >"$MLIP_GRAPH_REPORT"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/summary.txt"
source "$(dirname "${BASH_SOURCE[0]}")/gpu_stages.sh"  # stage NAME STATUS; status

if want tests_nequip; then
  (cd tests && timeout 140 bash -c 'py_nequip -m pytest -q -rfEs -p no:cacheprovider -m "gpu and not mace" test_cuda_graphs.py' 2>&1) \
    | tee "$OUT/tests_nequip.log" | tail -25
  stage "gpu tests (nequip)" "${PIPESTATUS[0]}"
fi
if want tests_mace; then
  (cd tests && timeout 90 bash -c 'py_mace -m pytest -q -rfEs -p no:cacheprovider -m "gpu and not nequip" test_cuda_graphs.py' 2>&1) \
    | tee "$OUT/tests_mace.log" | tail -15
  stage "gpu tests (mace)" "${PIPESTATUS[0]}"
fi

: >"$OUT/md_cli.log"
want cli && for flag in --cuda-graphs --no-cuda-graphs; do
  timeout 45 bash -c "py_nequip -m mlip_accel.integrations.cli md --device cuda --steps 300 --output none --quiet $flag" \
    2>&1 | tee -a "$OUT/md_cli.log"
done
want cli && python3 - "$OUT" <<'EOF'
import json, re, sys
text = open(f"{sys.argv[1]}/md_cli.log").read()
speeds = re.findall(r"speed\s+: ([0-9.]+) steps/s", text)
json.dump(dict(zip(["graphs", "no graphs"], speeds)), open(f"{sys.argv[1]}/md_cli.json", "w"))
print("md cli steps/s:", dict(zip(["graphs", "no graphs"], speeds)))
EOF

if want bench_nequip; then
  timeout 110 bash -c 'py_nequip scripts/bench_md_graphs.py --framework nequip --out "$OUT" --time-budget 75' 2>&1 | tail -12
  stage "bench nequip" "${PIPESTATUS[0]}"
fi
if want bench_mace; then
  timeout 120 bash -c 'py_mace scripts/bench_md_graphs.py --framework mace --out "$OUT" --time-budget 70' 2>&1 | tail -12
  stage "bench mace" "${PIPESTATUS[0]}"
fi
if want profile; then
  : >"$OUT/profile_md_step.jsonl"
  timeout 60 bash -c 'py_nequip scripts/profile_md_step.py --model default >>"$OUT/profile_md_step.jsonl"' 2>&1 | tail -3
  stage "profile default" "${PIPESTATUS[0]}"
  timeout 60 bash -c 'py_mace scripts/profile_md_step.py --model mace >>"$OUT/profile_md_step.jsonl"' 2>&1 | tail -3
  stage "profile mace" "${PIPESTATUS[0]}"
  cat "$OUT/profile_md_step.jsonl"
fi
python3 scripts/bench_md_graphs.py --merge "$OUT"/bench_md_graphs.mace.json "$OUT"/bench_md_graphs.nequip.json \
  --cli "$OUT/md_cli.json" --out "$OUT" >/dev/null
cat "$OUT/bench_md_graphs.md" "$MLIP_GRAPH_REPORT" "$OUT/summary.txt" 2>/dev/null
exit $status
