#!/usr/bin/env bash
# Issue-3 GMI benchmarks on a GPU machine. Writes JSON files under ${OUT:-out}.
#   bash bench/device_gmis.sh smoke|ant15|ant8|heavy|sms|multigpu|inference
# Expects the project importable (pip install -e '.[mujoco]', or PYTHONPATH with the wheels).
set -uo pipefail
OUT=${OUT:-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
py=${PYTHON:-python3}
heavy="auto:512:512:512:256:auto"
{ date -u; hostname; nproc; nvidia-smi --query-gpu=name,power.draw,memory.total,mig.mode.current,compute_mode --format=csv; } \
    | tee "$OUT/machine.txt"
table() { timeout 590 $py -m bench.gmi_table --warmup-s 3 --measure-s 8 "$@" 2>&1 | grep "^{.device"; }
case "${1:-smoke}" in
smoke)  # GPU tests, the inventory, and one short run of 2 GMIs at 50 % each
    $py -m pytest -q -m gpu tests 2>&1 | tail -3
    $py -m autotune.cli gpu --json "$OUT/gpu.json" | tail -8
    timeout 120 $py -m autotune.cli train --env Ant-v5 --actors 15 --envs-per-actor 16 \
        --batch-size 8192 --trainers 2 --mps-pct 50 --max-wall-s 20 --steps 100000000 \
        --quiet --json "$OUT/smoke.json" | tail -20
    ;;
ant15|ant8)  # Ant-v5: trainer device x GMIs x MPS %, one actor count per call
    table --env Ant-v5 --actors "${1#ant}" --devices cpu,cuda --gmis 1,2,4 \
        --mps 100,50,25,10 --out "$OUT/gmi_ant_${1#ant}.json"
    ;;
heavy)  # a GPU-heavy policy at a large batch: throughput vs SMs, then an MPS change mid-run
    table --env Ant-v5 --policy "$heavy" --batch-size 32768 --epochs 4 --minibatches 4 \
        --actors 15 --devices cuda --gmis 1,2 --mps 100,50,25,10 --out "$OUT/gmi_heavy.json"
    timeout 150 $py -m autotune.cli train --env Ant-v5 --policy "$heavy" --batch-size 32768 \
        --epochs 4 --minibatches 4 --lr 1e-3 --entropy-coef 0 --actors 15 \
        --envs-per-actor 16 --steps 100000000 --max-wall-s 75 --mps-change 20:100 \
        --mps-change 48:25 --quiet --json "$OUT/mps_change.json" | tail -20
    ;;
sms)  # the CPU/GPU-ratio experiment: a trainer heavy enough that SMs limit it, 1 GMI
    table --env Ant-v5 --policy auto:2048:2048:2048:auto --batch-size 32768 --epochs 8 \
        --minibatches 4 --actors 15 --devices cuda --gmis 1 --mps 100,50,25,10 \
        --out "$OUT/gmi_sms.json"
    ;;
multigpu)  # 2 GPUs x 2 GMIs: forced MPR vs MRR (Algorithm 1's pick) vs HAR; 1 GMI/GPU too
    for sync in mpr mrr har; do
        table --env Ant-v5 --policy "$heavy" --batch-size 32768 --epochs 4 --minibatches 4 \
            --actors 15 --devices cuda --gmis 2 --mps 100 --gpus 0,1 --grad-sync $sync \
            --out "$OUT/multigpu_2x2_$sync.json"
    done
    for sync in mpr mrr; do
        table --env Ant-v5 --policy "$heavy" --batch-size 32768 --epochs 4 --minibatches 4 \
            --actors 15 --devices cuda --gmis 1 --mps 100 --gpus 0,1 --grad-sync $sync \
            --out "$OUT/multigpu_2x1_$sync.json"
    done
    ;;
inference)  # where actions are computed: each actor's core vs one batched inference GMI
    table --env Ant-v5 --actors 15 --devices cpu,cuda --gmis 1 --mps 100 \
        --inference actor,gmi --out "$OUT/inference_ant15.json"
    table --env Ant-v5 --actors 8 --devices cuda --gmis 1 --mps 100 \
        --inference actor,gmi --out "$OUT/inference_ant8.json"
    table --env Ant-v5 --policy "$heavy" --actors 15 --devices cuda --gmis 1 --mps 100 \
        --inference actor,gmi --out "$OUT/inference_heavy.json"
    table --env Ant-v5 --policy "$heavy" --actors 15 --devices cuda --gmis 1 --mps 50 \
        --inference gmi --inference-mps 25 --out "$OUT/inference_heavy_mps.json"
    ;;
esac
