#!/usr/bin/env bash
# Issue-5 offline study, export and re-measure on a GPU machine (Ant-v5), in commands of
# <= 10 minutes:
#   bash bench/device_study.sh study [TRIALS]   # TRIALS more trials of the study (resumes it)
#   bash bench/device_study.sh remeasure FILE   # train --config FILE vs the default, A B A B
#   bash bench/device_study.sh study-cpu [TRIALS]  # a study of the trainer on the CPU (the GPU
#                                       # left idle) around the cuda export, and its export
#                                       # (ENV, POLICY and NAME for a workload other than Ant;
#                                       # THREADS the trainer threads tried, FROM a config
#                                       # file to start from)
# The study lives in ${STATE:-bench_state}/study.db and is copied to $OUT after each part, so a
# fresh machine can carry it to the next part. Writes JSON and logs under ${OUT:-out}.
set -uo pipefail
OUT=${OUT:-out}
STATE=${STATE:-bench_state}
mkdir -p "$OUT" "$STATE"
export PYTHONUNBUFFERED=1 COLUMNS=160
py=${PYTHON:-python3}
db="sqlite:///$(realpath "$STATE")/study.db"
{ date -u; hostname; nproc; nvidia-smi --query-gpu=name,power.draw,memory.total,mig.mode.current,compute_mode --format=csv; } \
    | tee "$OUT/machine-$1.txt"
case "$1" in
study)
    stamp=$(date -u +%H%M%S)
    $py -m autotune.cli study --env Ant-v5 --study ant-study --storage "$db" \
        --trials "${2:-10}" --trial-s 40 --warmup-s 10 \
        --knob actors=2..16 --knob envs_per_actor=8..64 --knob batch_size=1024..16384 \
        --knob trainers=1,2 --knob mps_pct=25,50,100 --knob inference=actor,gmi \
        --knob trainer_device=cuda --knob chunk_bytes=262144 --knob trainer_threads=1 \
        --knob rollout_len=32 --json "$OUT/study-$stamp.json" 2>&1 | grep -v "^\[I " | tail -40
    ;;
study-cpu)
    # Ant-v5 with bench.compare's policy (ENV and POLICY pick another workload, NAME its study
    # and files); the actors and trainer threads split the 16 cores; PRECISIONS=fp32,bf16 opens
    # the trainer's precision too (default fp32, as in the studies of 2026-11-22 and -23);
    # THREADS (default 1,2,4) the trainer threads; FROM=FILE starts the study from that config
    name=${NAME:-ant}
    from=(); [ -n "${FROM:-}" ] && from=(--from "$FROM")
    cpu_db="sqlite:///$(realpath "$STATE")/study-cpu-$name.db"
    $py -m autotune.cli study "${from[@]}" --env "${ENV:-Ant-v5}" --study "$name-study-cpu" --storage "$cpu_db" \
        --policy "${POLICY:-auto:256:128:64:auto}" --trials "${2:-6}" --confirm "${CONFIRM:-2}" --trial-s 35 --warmup-s 10 --no-profile \
        --knob trainer_device=cpu --knob actors=11..15 --knob trainer_threads="${THREADS:-1,2,4}" \
        --knob envs_per_actor=16,32,64 --knob batch_size=8192,16384,32768 --knob trainers=1 \
        --knob mps_pct=100 --knob trainer_precision="${PRECISIONS:-fp32}" \
        --knob inference=actor --knob chunk_bytes=262144 --knob rollout_len=32 \
        --json "$OUT/study-cpu-$name.json" 2>&1 | grep -v "^\[I " | tail -30
    $py -m autotune.cli export --study "$name-study-cpu" --storage "$cpu_db" \
        --out "$OUT/$name-export-cpu.json" --plots "$OUT/plots-cpu-$name" 2>&1 | tail -20
    cp "$STATE/study-cpu-$name.db" "$OUT/" 2>/dev/null || true
    ;;
remeasure)
    # the default and the exported config, each a fresh 100 s run, twice, interleaved
    for k in 1 2; do
        $py -m autotune.cli train --env Ant-v5 --steps 1000000000 --max-wall-s 100 --quiet \
            --json "$OUT/default-$k.json" 2>&1 | tail -3
        $py -m autotune.cli train --config "$2" --steps 1000000000 --max-wall-s 100 --quiet \
            --json "$OUT/exported-$k.json" 2>&1 | tail -3
    done
    ;;
esac
cp "$STATE/study.db" "$OUT/study.db" 2>/dev/null || true
