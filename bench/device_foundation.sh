#!/usr/bin/env bash
# The foundation benchmarks on a GPU machine, in one go. Writes JSON files under ${OUT:-out}.
#   bash bench/device_foundation.sh
# Expects the project importable (pip install -e '.[mujoco]', or PYTHONPATH with the wheels).
set -uo pipefail
OUT=${OUT:-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
py=${PYTHON:-python3}
cores=$(nproc)
actors=$((cores - 1))
{ date -u; hostname; nproc; nvidia-smi --query-gpu=name,power.draw,memory.total --format=csv; } \
    | tee "$OUT/machine.txt"
$py -m pytest -q -m gpu tests 2>&1 | tail -3
# 1. CartPole with the CLI defaults (trainer on cuda when present)
timeout 120 $py -m autotune.cli train --quiet --json "$OUT/cartpole.json" | tail -18
# 2. Ant-v5, one actor per core but one: trained steps/s beside raw random stepping, same run
timeout 260 $py -m bench.end_to_end --env Ant-v5 --actors "$actors" --envs-per-actor 16 \
    --steps 3000000 --batch-size 8192 --raw-seconds 20 --out "$OUT/ant_e2e.json" > /dev/null
$py -c "import json,sys; d=json.load(open(sys.argv[1])); r=d.pop('result'); print(d, r['return_mean'])" "$OUT/ant_e2e.json"
# 3. Pendulum-v1 learning (continuous actions)
timeout 90 $py -m autotune.cli train --env Pendulum-v1 --steps 300000 --reward-scale 0.1 \
    --gamma 0.95 --actors 4 --quiet --json "$OUT/pendulum.json" | tail -18
# 4. the stage pipeline on synthetic rollouts, beside raw pyzmq
timeout 150 $py -m bench.pipeline_throughput --producers 8 --seconds 3 \
    --out "$OUT/pipeline.json" | grep '^|'
