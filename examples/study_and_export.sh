#!/usr/bin/env bash
# The offline workflow on CartPole (CPU, about 2 minutes): a short study, its export with plots
# and hardware sizing, and the exported config run as is. On a GPU machine use an env such as
# Ant-v5 (pip install -e '.[mujoco]'), more trials and longer ones (see docs/BENCHMARKS.md s. 9).
#   bash examples/study_and_export.sh [WORKDIR]
set -euo pipefail
dir=${1:-study-example}
mkdir -p "$dir"
db="sqlite:///$(realpath "$dir")/study.db"
autotune study --env CartPole-v1 --study cartpole --storage "$db" --trials 4 --trial-s 15 \
    --warmup-s 2 --knob actors=1..2 --knob envs_per_actor=4..16 --knob trainers=1 \
    --knob batch_size=512,1024 --knob inference=actor --json "$dir/study.json"
autotune export --study cartpole --storage "$db" --out "$dir/cartpole.yaml" \
    --plots "$dir/plots" --target-cores 64
autotune train --config "$dir/cartpole.yaml" --steps 100000 --json "$dir/run.json"
