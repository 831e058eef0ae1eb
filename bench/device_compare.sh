#!/usr/bin/env bash
# Issue-6 side-by-side benchmarks on a GPU machine, in parts of <= 10 minutes each:
#   bash bench/device_compare.sh ant        # Ant-v5: limit, SB3 cpu/cuda, CleanRL, default,
#                                           # exported, online-tuned
#   bash bench/device_compare.sh others     # HalfCheetah-v5, Humanoid-v5, and Ant-v5 with a
#                                           # GPU-heavy policy (fewer arms each)
#   bash bench/device_compare.sh learning   # Ant-v5 returns at 1M steps, 3 seeds, ours and SB3
# Writes under ${OUT:-out}/<part>/; then `python -m bench.compare report --dir ...` and
# `python -m bench.learning report --dir ...` make the tables and plots.
set -uo pipefail
OUT=${OUT:-out}
export PYTHONUNBUFFERED=1 COLUMNS=160
py=${PYTHON:-python3}
EXPORT=${EXPORT:-docs/results/2026-11-22/study/ant-export.json}
SB3_ARM=${SB3_ARM:-sb3-cuda}
mkdir -p "$OUT/$1"
{ date -u; hostname; nproc; nvidia-smi --query-gpu=name,power.draw,memory.total,mig.mode.current,compute_mode --format=csv; } \
    | tee "$OUT/$1/machine.txt"
cmp() { $py -m bench.compare run --exported "$EXPORT" "$@" 2>&1 | grep -v "^\[I "; }
case "$1" in
ant)
    cmp --env Ant-v5 --policy auto:256:128:64:auto --seconds 40 --tuned-s 170 --warmup-s 10 \
        --arms limit,sb3-cpu,sb3-cuda,cleanrl,default,exported,tuned --out "$OUT/ant/run"
    ;;
others)
    cmp --env HalfCheetah-v5 --policy auto:256:128:64:auto --seconds 25 --warmup-s 8 \
        --arms limit,$SB3_ARM,default,exported --out "$OUT/others/halfcheetah"
    cmp --env Humanoid-v5 --policy auto:400:200:100:auto --seconds 25 --warmup-s 8 \
        --arms limit,$SB3_ARM,default,exported --out "$OUT/others/humanoid"
    cmp --env Ant-v5 --policy auto:1024:1024:512:auto --seconds 25 --warmup-s 8 \
        --arms limit,$SB3_ARM,default,exported --out "$OUT/others/ant-heavy"
    ;;
learning)
    $py -m bench.learning run --env Ant-v5 --steps 1000000 --seeds 0,1,2 --arms sb3,ours \
        --parallel 3 --policy auto:256:128:64:auto --config "$EXPORT" --out "$OUT/learning/run"
    ;;
*)
    echo "usage: bash bench/device_compare.sh ant|others|learning" >&2
    exit 2
    ;;
esac
