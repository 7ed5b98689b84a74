#!/usr/bin/env bash
# Issue 13 on the GPU: the graph cache (shared memory pool, automatic switch-off, host operations per call,
# neighbour skin), `mlip-accel md` with and without graphs and with a skin, and the 32-10648-atom sweep
# (scripts/bench_md_sweep.py, Symmetrix-XL as a MACE peer). Run from the repository root after
# scripts/fetch_device_wheels.sh; results under $OUT:
#   tests_nequip.log, tests_mace.log, graph_report.jsonl     gpu tests and the numbers they record
#   md_cli.log, md_cli.json                                   mlip-accel md steps/s: graphs, no graphs, graphs + skin (ASE
#                                                             loop), and the ASE loop vs the device-resident loop (1000 steps)
#   profile_device_md.jsonl                                   the device loop's step: GPU busy time, model alone, lists, reads
#   bench_md_sweep.<framework>.<dtypes>.json, bench_md_sweep.{json,md}   the sweep
#   summary.txt                                               one line per stage
# PARTS picks stages (default: tests_nequip tests_mace cli sweep_nequip sweep_mace); also skins (the device loop's
# steps/s by neighbour skin), force_error (scripts/mace_force_error_vs_fp64.py), bench_nequip bench_mace
# (scripts/bench_md_graphs.py: 32/216/1000 atoms graphed vs eager -> bench_md_graphs.{json,md}) and profile
# (scripts/profile_md_step.py: the phases of one ASE MD step -> profile_md_step.jsonl). This script took over
# scripts/gpu_check_graphs.sh's stages.
# SWEEP_DTYPES (default float32), SWEEP_SIZES (default 2 3 5 7 10 11: 64 to 10648 atoms + the 32-atom cluster).
#
# All stages need more than one device call's 10 minutes and 64 MiB of carried wheels; the prepared calls:
#   NequIP side (~8 min), carry .whl/common .whl/nequip:
#     OUT=$OUT PARTS="tests_nequip cli sweep_nequip" bash scripts/gpu_check_graphs_sweep.sh
#   MACE side + Symmetrix-XL (~7 min), carry .whl/common .whl/mace .whl/symmetrix:
#     OUT=$OUT PARTS="tests_mace sweep_mace" bash scripts/gpu_check_graphs_sweep.sh
#   fp64 sweep (optional), carry .whl/common .whl/nequip .whl/mace:
#     OUT=$OUT PARTS="sweep_nequip sweep_mace" SWEEP_DTYPES=float64 SWEEP_SIZES="2 3 5 7" bash scripts/gpu_check_graphs_sweep.sh
# then, here: python3 scripts/bench_md_sweep.py --merge <the calls' bench_md_sweep.*.*.json> --out benchmarks/
set -uo pipefail
PARTS=${PARTS:-tests_nequip tests_mace cli sweep_nequip sweep_mace}
SWEEP_DTYPES=${SWEEP_DTYPES:-float32}
SWEEP_SIZES=${SWEEP_SIZES:-2 3 5 7 10 11}
want() { [[ " $PARTS " == *" $1 "* ]]; }
export OUT=${OUT:-$PWD/gpu_check_graphs_sweep_out}
mkdir -p "$OUT"
source scripts/device_env.sh || exit 1
export MLIP_ACCEL_CACHE_DIR=${MLIP_ACCEL_CACHE_DIR:-/tmp/mlip_accel_cache}
export MLIP_GRAPH_REPORT=$OUT/graph_report.jsonl
export OMP_NUM_THREADS=4
skip_oeq_build
touch "$MLIP_GRAPH_REPORT"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee -a "$OUT/summary.txt"
source "$(dirname "${BASH_SOURCE[0]}")/gpu_stages.sh"  # stage NAME STATUS; status

if want tests_nequip; then
  (cd tests && timeout 200 bash -c 'py_nequip -m pytest -q -rfEs -p no:cacheprovider -m "gpu and not mace" test_graph_cache.py test_cuda_graphs.py test_device_md.py' 2>&1) \
    | tee "$OUT/tests_nequip.log" | tail -25
  stage "gpu tests (nequip)" "${PIPESTATUS[0]}"
fi
if want tests_mace; then
  (cd tests && timeout 100 bash -c 'py_mace -m pytest -q -rfEs -p no:cacheprovider -m "gpu and not nequip" test_graph_cache.py test_cuda_graphs.py' 2>&1) \
    | tee "$OUT/tests_mace.log" | tail -15
  stage "gpu tests (mace)" "${PIPESTATUS[0]}"
fi

if want cli; then
  : >"$OUT/md_cli.log"
  # the ASE loop (--integrator ase: the default before the device-resident loop), 300 steps
  for flags in "--cuda-graphs --neighbor-skin 0" "--no-cuda-graphs" "--cuda-graphs" "--cuda-graphs --neighbor-skin 0.5"; do
    echo "### mlip-accel md $flags --integrator ase" >>"$OUT/md_cli.log"
    timeout 60 bash -c "py_nequip -m mlip_accel.integrations.cli md --device cuda --steps 300 --output none --quiet \
      $flags --integrator ase" >>"$OUT/md_cli.log" 2>&1
    stage "md cli $flags --integrator ase" $?
  done
  # the issue's target (>= 1000 steps/s on the default model): the device-resident loop against the ASE loop,
  # both graphed with the default skin, 1000 steps (a 1000-steps/s run lasts a second: fewer would time noise)
  for flags in "--cuda-graphs --integrator device" "--cuda-graphs --integrator ase" \
               "--cuda-graphs --integrator device --ensemble nve"; do
    echo "### mlip-accel md $flags --steps 1000" >>"$OUT/md_cli.log"
    timeout 60 bash -c "py_nequip -m mlip_accel.integrations.cli md --device cuda --steps 1000 --output none --quiet \
      $flags" >>"$OUT/md_cli.log" 2>&1
    stage "md cli $flags" $?
  done
  # what bounds the device loop's step: GPU busy time, the model alone, lists built and host reads per 1000 steps
  timeout 120 bash -c "py_nequip scripts/profile_device_md.py" >"$OUT/profile_device_md.jsonl" 2>"$OUT/profile_device_md.err"
  stage "profile device md" $?
  cat "$OUT/profile_device_md.jsonl"
  python3 - "$OUT" <<'EOF'
import json, re, sys
text = open(f"{sys.argv[1]}/md_cli.log").read()
runs = re.split(r"^### mlip-accel md ", text, flags=re.M)[1:]
speeds = {run.splitlines()[0]: (re.findall(r"speed\s+: ([0-9.]+) steps/s", run) or ["-"])[0] for run in runs}
json.dump(speeds, open(f"{sys.argv[1]}/md_cli.json", "w"))
print("md cli steps/s:", speeds)
EOF
fi

if want skins; then
  # the device loop's steps/s and lists per 1000 steps against the neighbour skin (default model, NVT, 1000 steps)
  : >"$OUT/md_cli_skins.log"
  for skin in 0.5 0.75 1.0 1.5; do
    echo "### skin $skin" >>"$OUT/md_cli_skins.log"
    timeout 60 bash -c "py_nequip -m mlip_accel.integrations.cli md --device cuda --steps 1000 --output none \
      --cuda-graphs --integrator device --neighbor-skin $skin" >>"$OUT/md_cli_skins.log" 2>&1
    stage "md cli device loop, skin $skin" $?
  done
  python3 - "$OUT" <<'EOF'
import json, re, sys
text = open(f"{sys.argv[1]}/md_cli_skins.log").read()
runs = re.split(r"^### skin ", text, flags=re.M)[1:]
rows = {run.splitlines()[0]: {"steps_per_s": (re.findall(r"speed\s+: ([0-9.]+) steps/s", run) or ["-"])[0],
                              "lists": (re.findall(r"([0-9]+) lists built", run) or ["-"])[0]} for run in runs}
json.dump(rows, open(f"{sys.argv[1]}/md_cli_skins.json", "w"))
print("device loop by skin:", rows)
EOF
fi
if want force_error; then
  timeout 150 bash -c 'py_mace scripts/mace_force_error_vs_fp64.py --out "$OUT"' 2>&1 | grep -v Warn | tail -8
  stage "mace fp32 force error vs fp64" "${PIPESTATUS[0]}"
fi

tag=$(echo "$SWEEP_DTYPES" | tr ' ' '-')
if want sweep_nequip; then
  timeout 290 bash -c "py_nequip scripts/bench_md_sweep.py --framework nequip --dtypes $SWEEP_DTYPES --sizes $SWEEP_SIZES \
    --out \"$OUT\" --time-budget 230" 2>&1 | grep -v Warning | tail -40
  stage "sweep nequip $SWEEP_DTYPES" "${PIPESTATUS[0]}"
fi
if want sweep_mace; then
  timeout 400 bash -c "py_mace scripts/bench_md_sweep.py --framework mace --dtypes $SWEEP_DTYPES --sizes $SWEEP_SIZES \
    --out \"$OUT\" --time-budget 330" 2>&1 | grep -v Warning | tail -50
  stage "sweep mace $SWEEP_DTYPES" "${PIPESTATUS[0]}"
fi
# the 32/216/1000-atom graphed-vs-eager benchmark and the phases of one ASE MD step (not in the default PARTS)
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
if compgen -G "$OUT/bench_md_graphs.*.json" >/dev/null; then
  python3 scripts/bench_md_graphs.py --merge "$OUT"/bench_md_graphs.*.json --cli "$OUT/md_cli.json" --out "$OUT" >/dev/null
  cat "$OUT/bench_md_graphs.md"
fi

if compgen -G "$OUT/bench_md_sweep.*.*.json" >/dev/null; then
  python3 scripts/bench_md_sweep.py --merge "$OUT"/bench_md_sweep.*.*.json --out "$OUT" >/dev/null
  cat "$OUT/bench_md_sweep.md"
fi
cat "$MLIP_GRAPH_REPORT" "$OUT/summary.txt" 2>/dev/null
exit $status
