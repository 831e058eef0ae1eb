#!/usr/bin/env bash
# Issue-4 online tuning on a GPU machine (Ant-v5), split over commands of <= 10 minutes:
#   bash bench/device_tuning.sh tune1    # first 510 s of train --tune (study in $STATE)
#   bash bench/device_tuning.sh tune2    # the remaining 390 s: resumes the same study
#   bash bench/device_tuning.sh baselines  # the grid sweep of the same knobs, then the default
#   bash bench/device_tuning.sh sidebyside TUNED GRID  # both best configs (JSON), A B A B
# The study lives in ${STATE:-bench_state}/tuning.db and is copied to $OUT after each part, so
# a fresh machine can carry it to the next part. Writes JSON under ${OUT:-out}.
set -uo pipefail
OUT=${OUT:-out}
STATE=${STATE:-bench_state}
mkdir -p "$OUT" "$STATE"
export PYTHONUNBUFFERED=1
py=${PYTHON:-python3}
db="sqlite:///$(realpath "$STATE")/tuning.db"
{ date -u; hostname; nproc; nvidia-smi --query-gpu=name,power.draw,memory.total,mig.mode.current,compute_mode --format=csv; } \
    | tee "$OUT/machine-$1.txt"
arm() { $py -m bench.online_tuning "$@" --env Ant-v5 --storage "$db" 2>&1 | grep -v "^\[I " | tail -25; }
case "$1" in
tune1) arm tune --seconds 510 --out "$OUT/tune1.json" ;;
tune2) arm tune --seconds 390 --out "$OUT/tune2.json" ;;
baselines)
    arm grid --seconds 330 --out "$OUT/grid.json"
    arm default --seconds 120 --out "$OUT/default.json"
    ;;
sidebyside)
    for k in 1 2; do
        arm fixed --values "$2" --seconds 100 --out "$OUT/fixed-tuned-$k.json"
        arm fixed --values "$3" --seconds 100 --out "$OUT/fixed-grid-$k.json"
    done
    ;;
esac
cp "$STATE/tuning.db" "$OUT/tuning.db" 2>/dev/null || true
