#!/usr/bin/env bash
# Several GPUs, in one call on the 2-GPU device machine (nvidia-h200-x2), from the repository root with .whl
# carried (scripts/fetch_device_wheels.sh):
#
#     bash scripts/multigpu_check.sh [--steps N]
#
# Under $OUT (default ./multigpu_out):
#   setup.log                  GPUs, topology, versions, environment install
#   multigpu_tests.log, multigpu_junit.xml   tests/test_multigpu.py (ops on cuda:1 with cuda:0 the default,
#                              two models on two devices, model moved, mixed devices refused, no context
#                              on the unused GPU, CUDA_VISIBLE_DEVICES reordered)
#   nvidia_smi_apps.csv        per process and GPU memory, sampled every 0.5 s during the trainings
#   train/                     scripts/multigpu_train.py: nequip-train (enable_MlipAccel, Lightning DDP,
#                              devices=2) and mlip-accel-mace-train --distributed under torchrun, each
#                              against one GPU with the same global batch; logs and per-rank records
#   multigpu_train.json, multigpu_train.md   losses per step vs one GPU, parameters across ranks, per-rank
#                              step times, samples/s, peak memory, memory on the other GPU
#   summary.txt                PASSED/FAILED per stage
# Each stage has its own time limit so that the whole run fits in about 280 s; exit status non-zero if a
# stage failed.
set -uo pipefail
# NVLink multicast stays off in every process (it can take the host's GPUs out of service): KINDS.md
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1 OMP_NUM_THREADS=${OMP_NUM_THREADS:-4}
export MLIP_ACCEL_CACHE_DIR=${MLIP_ACCEL_CACHE_DIR:-/tmp/mlip_accel_cache}
OUT=${OUT:-$PWD/multigpu_out}
steps=6
[[ ${1:-} == --steps ]] && steps=$2
mkdir -p "$OUT/train"
: >"$OUT/summary.txt"
status=0
stage() {  # stage NAME STATUS
  echo "$1: $([[ $2 -eq 0 ]] && echo PASSED || echo "FAILED ($2)")" | tee -a "$OUT/summary.txt"
  [[ $2 -eq 0 ]] || status=1
}
t0=$SECONDS

{
  nvidia-smi --query-gpu=index,name,memory.total,memory.used --format=csv,noheader
  nvidia-smi topo -m 2>/dev/null | head -5
  python3 -c "import torch, cupy; print('torch', torch.__version__, 'cupy', cupy.__version__, 'gpus', torch.cuda.device_count())"
  env | grep -E '^(NCCL_NVLS_ENABLE|TORCH_SYMM_MEM_DISABLE_MULTICAST|NVSHMEM_DISABLE_NVLS)='
} >"$OUT/setup.log" 2>&1
# shellcheck disable=SC1091
source scripts/device_env.sh >>"$OUT/setup.log" 2>&1 || { stage "environment" 1; exit 1; }
export PATH=/tmp/site-nequip/bin:$PATH  # nequip-train (installed by device_env.sh with --target)
echo "setup done at $((SECONDS - t0)) s" >>"$OUT/setup.log"

(cd tests && timeout 90 env PYTHONPATH="$MLIP_PYTHONPATH_NEQUIP" python3 -m pytest -q -rfEs -p no:cacheprovider \
  --junitxml="$OUT/multigpu_junit.xml" test_multigpu.py 2>&1) >"$OUT/multigpu_tests.log"
stage "multigpu tests" $?
tail -3 "$OUT/multigpu_tests.log"

nvidia-smi --query-compute-apps=pid,process_name,gpu_uuid,used_memory --format=csv -lms 500 \
  >"$OUT/nvidia_smi_apps.csv" 2>/dev/null &
smi=$!
nvidia-smi --query-gpu=index,uuid --format=csv,noheader >"$OUT/gpu_uuids.csv" 2>/dev/null

timeout 85 bash -c "py_nequip scripts/multigpu_train.py nequip '$OUT/train' --steps $steps" >>"$OUT/train.log" 2>&1
stage "nequip-train ddp (1 vs 2 GPUs)" $?
timeout 75 bash -c "py_mace scripts/multigpu_train.py mace '$OUT/train' --steps $steps" >>"$OUT/train.log" 2>&1
stage "mlip-accel-mace-train --distributed (1 vs 2 GPUs)" $?
kill "$smi" 2>/dev/null

py_nequip scripts/multigpu_train.py report "$OUT/train" >"$OUT/report.log" 2>&1
stage "training equal to one GPU, no memory on the other GPU" $?
cp "$OUT/train/multigpu_train.json" "$OUT/train/multigpu_train.md" "$OUT/" 2>/dev/null
# the logs' last lines, for a reader of the tail of this call's output
for f in "$OUT"/train/*.log; do echo "== $f"; tail -4 "$f"; done
cat "$OUT/report.log"
echo "total $((SECONDS - t0)) s" | tee -a "$OUT/summary.txt"
exit $status
