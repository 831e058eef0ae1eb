#!/usr/bin/env bash
# Issue-6 side-by-side benchmarks on a GPU machine, in parts of <= 10 minutes each:
#   bash bench/device_compare.sh ant        # Ant-v5: limit, SB3 cpu/cuda, CleanRL, default,
#                                           # exported, online-tuned
#   bash bench/device_compare.sh ant-tuned  # Ant-v5: the online-tuned arm for 400 s between
#                                           # two limits (the ant part gives it 170 s)
#   bash bench/device_compare.sh others     # HalfCheetah-v5, Humanoid-v5, and Ant-v5 with a
#                                           # GPU-heavy policy (fewer arms each; OTHERS="humanoid
#                                           # ant-heavy" picks some)
#   WORKLOAD=humanoid bash bench/device_compare.sh study-other  # that workload's own study and
#                                           # export (others runs it with OWN_EXPORTS=DIR)
#   bash bench/device_compare.sh learning   # Ant-v5 returns at 1M and 3M steps, 3 seeds, ours
#                                           # and SB3 (several sittings: each resumes from
#                                           # checkpoints)
#   bash bench/device_compare.sh cpu-study  # a study of the trainer on the CPU (GPU idle, no
#                                           # context) and its export (TRIALS, default 8;
#                                           # WORKLOAD, default ant; PRECISIONS=fp32,bf16
#                                           # opens the trainer's precision)
#   bash bench/device_compare.sh cpu-trainer  # that export (CPU_EXPORT) beside the limit and
#                                           # the cuda export (WORKLOAD, default ant)
#   bash bench/device_compare.sh actor-inference  # an actor's policy call, torch vs numpy
# Writes under ${OUT:-out}/<part>/; then `python -m bench.compare report --dir ...` and
# `python -m bench.learning report --dir ...` make the tables and plots.
set -uo pipefail
OUT=${OUT:-out}
export PYTHONUNBUFFERED=1 COLUMNS=160
py=${PYTHON:-python3}
EXPORT=${EXPORT:-bench/exports/ant-export.json}
SB3_ARM=${SB3_ARM:-sb3-cuda}
STATE=${STATE:-bench_state}
# ours in the learning part: PPO's MuJoCo learner settings (the zoo's minibatch size, epochs and
# lr, no entropy bonus) on 2 actors x 8 envs; the steps/J-tuned export (batches of 16,384) is
# measured for speed, not for returns at 1M steps
OURS_LEARNER=${OURS_LEARNER:-"--envs-per-actor 8 --batch-size 2048 --epochs 10 --minibatches 32 --lr 3e-4 --entropy-coef 0"}
mkdir -p "$OUT/$1"
{ date -u; hostname; nproc; nvidia-smi --query-gpu=name,power.draw,memory.total,mig.mode.current,compute_mode --format=csv; } \
    | tee "$OUT/$1/machine.txt"
workload() {  # sets env and pol for a workload name of the others part
    case "$1" in
    ant) env=Ant-v5 pol=auto:256:128:64:auto ;;
    halfcheetah) env=HalfCheetah-v5 pol=auto:256:128:64:auto ;;
    humanoid) env=Humanoid-v5 pol=auto:400:200:100:auto ;;
    ant-heavy) env=Ant-v5 pol=auto:1024:1024:512:auto ;;
    *) echo "unknown workload '$1' (ant, halfcheetah, humanoid, ant-heavy)" >&2; return 1 ;;
    esac
}
cmp() { $py -m bench.compare run --exported "$EXPORT" "$@" 2>&1 | grep -v "^\[I "; }
case "$1" in
ant)
    cmp --env Ant-v5 --policy auto:256:128:64:auto --seconds 40 --tuned-s 170 --warmup-s 10 \
        --arms limit,sb3-cpu,sb3-cuda,cleanrl,default,exported,tuned --out "$OUT/ant/run"
    ;;
ant-tuned)
    cmp --env Ant-v5 --policy auto:256:128:64:auto --seconds 40 --tuned-s 400 --warmup-s 10 \
        --arms limit,tuned --limit-again --out "$OUT/ant-tuned/run"
    ;;
others)
    # OTHERS picks the workloads (default all three: halfcheetah humanoid ant-heavy). Each runs
    # section 9's Ant export; a workload's own export from `study-other`, if OWN_EXPORTS holds
    # one (<workload>-export.json), runs beside it as the exported-own arm. ARMS sets the arms,
    # EXPORT the unlabelled export, ROUNDS how many times each workload's arms run (each round
    # between its own two limits).
    case "${ROUNDS:-1}" in
    '' | *[!0-9]* | 0) echo "ROUNDS=$ROUNDS: a whole number >= 1" >&2; exit 2 ;;
    esac
    for w in ${OTHERS:-halfcheetah humanoid ant-heavy}; do
        workload "$w" || exit 2
        own=()
        [ -f "${OWN_EXPORTS:-}/$w-export.json" ] && own=(--exported "own=$OWN_EXPORTS/$w-export.json")
        for k in $(seq 1 "${ROUNDS:-1}"); do  # ROUNDS > 1: the same arms again, in round<k>/
            sub=$w; [ "${ROUNDS:-1}" -gt 1 ] && sub=$w/round$k
            cmp --env $env --policy $pol --seconds 20 --warmup-s 8 "${own[@]}" \
                --arms ${ARMS:-limit,$SB3_ARM,default,exported} --limit-again \
                --out "$OUT/others/$sub"
        done
    done
    ;;
study-other)
    # a study of one of the other workloads (WORKLOAD) and its export, so that workload runs a
    # config of its own rather than the Ant export: TRIALS (default 10) of 30 s that start from
    # the Ant export (EXPORT, its first trial) with the GPU trainer's knobs and where actions
    # are computed open; the last CONFIRM (default 3) re-measure the leaders (one lucky 30 s
    # trial picked Humanoid's first export); REFERENCE_EVERY=K re-runs the start config after
    # every K trials and ranks trials scaled by it; NICE=0,10 opens the actors' niceness
    w=${WORKLOAD:?WORKLOAD=halfcheetah, humanoid or ant-heavy}
    mkdir -p "$STATE"
    workload "$w" || exit 2
    db="sqlite:///$(realpath "$STATE")/study-$w.db"
    mkdir -p "$OUT/study-other"
    $py -m autotune.cli study --from "$EXPORT" --env $env --study "study-$w" --storage "$db" --policy $pol \
        --trials "${TRIALS:-10}" --confirm "${CONFIRM:-3}" --trial-s 30 --warmup-s 8 --no-profile \
        --reference-every "${REFERENCE_EVERY:-0}" ${NICE:+--knob actor_nice=$NICE} \
        --knob actors=11..15 --knob envs_per_actor=16,32,64 --knob batch_size=8192,16384,32768 \
        --knob trainers=1,2 --knob mps_pct=50,100 --knob inference=actor,gmi \
        --knob trainer_device=cuda --knob trainer_threads=1 --knob chunk_bytes=262144 \
        --knob rollout_len=32 --json "$OUT/study-other/study-$w.json" 2>&1 | grep -v "^\[I " | tail -30
    $py -m autotune.cli export --study "study-$w" --storage "$db" \
        --out "$OUT/study-other/$w-export.json" --plots "$OUT/study-other/plots-$w" 2>&1 | tail -20
    cp "$STATE/study-$w.db" "$OUT/study-other/" 2>/dev/null || true
    ;;
learning)
    # six runs at once, 3 seeds each of ours and SB3 (16 cores: ours on 3-core slices, SB3 on
    # 3/2/2 cores with 2 envs each). SB3 (about 600 steps/s here) and ours (about 1,000) need
    # several sittings for 1M and 3M steps: run this part again (with $STATE carried) and each
    # run goes on from its checkpoint; $OUT/learning/state.tgz holds $STATE/learning after each.
    $py -m bench.learning run --env Ant-v5 --steps "${LEARN_STEPS:-3000000}" --seeds 0,1,2 \
        --arms "${LEARN_ARMS:-ours,sb3}" --parallel 6 --peer-envs 2 --policy auto:256:128:64:auto \
        --max-wall-s "${MAX_WALL_S:-500}" --ours-args "$OURS_LEARNER" --out "$STATE/learning"
    tar -czf "$OUT/learning/state.tgz" "$STATE/learning"
    ;;
cpu-study)
    # the steps/J-vs-limit goal: the limit leaves the GPU idle with no CUDA context (~70 W on
    # the H100, ~120 W with one), so a trainer on the CPU is the other candidate. About 55 s
    # per trial: 8 trials fit one 10-minute device command. WORKLOAD (default ant) picks the
    # env and policy as in the others part; PRECISIONS, THREADS and FROM go to study-cpu
    w=${WORKLOAD:-ant}
    workload "$w" || exit 2
    ENV=$env POLICY=$pol NAME=$w STATE=$STATE OUT=$OUT/cpu-study \
        bash bench/device_study.sh study-cpu "${TRIALS:-8}"
    ;;
cpu-trainer)
    # a separate command from cpu-study (both do not fit one): carry the export it wrote
    w=${WORKLOAD:-ant}
    workload "$w" || exit 2
    cmp --env $env --policy $pol --seconds 40 --warmup-s 10 \
        --arms limit,exported --exported "cpu=${CPU_EXPORT:-$OUT/cpu-study/$w-export-cpu.json}" --limit-again \
        --out "$OUT/cpu-trainer/$w"
    ;;
actor-inference)
    $py -m bench.actor_inference --envs 8,32,64 --out "$OUT/actor-inference/actor_inference.json"
    ;;
*)
    echo "usage: bash bench/device_compare.sh ant|ant-tuned|others|study-other|learning|cpu-study|cpu-trainer|actor-inference" >&2
    exit 2
    ;;
esac
