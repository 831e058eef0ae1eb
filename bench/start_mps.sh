#!/usr/bin/env bash
# Starts the NVIDIA MPS control daemon on a GPU machine, if none answers yet, with its own pipe
# and log directories; the benchmarks' GMIs then find it there (runtime/hw/mps.py looks in
# $CUDA_MPS_PIPE_DIRECTORY, default /tmp/nvidia-mps). Without it the runtime starts a private
# daemon per run. Stop it with: echo quit | CUDA_MPS_PIPE_DIRECTORY=... nvidia-cuda-mps-control
#   bash bench/start_mps.sh            # then: python -m bench <suite> ...
set -euo pipefail
export CUDA_MPS_PIPE_DIRECTORY=${CUDA_MPS_PIPE_DIRECTORY:-/tmp/nvidia-mps}
export CUDA_MPS_LOG_DIRECTORY=${CUDA_MPS_LOG_DIRECTORY:-/tmp/nvidia-mps-log}
if ! command -v nvidia-cuda-mps-control > /dev/null; then
    echo "nvidia-cuda-mps-control is not on PATH: no MPS here" >&2
    exit 1
fi
if echo get_server_list | timeout 10 nvidia-cuda-mps-control > /dev/null 2>&1; then
    echo "MPS control daemon already running (pipes in $CUDA_MPS_PIPE_DIRECTORY)"
    exit 0
fi
mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
nvidia-cuda-mps-control -d
for _ in $(seq 50); do
    if echo get_server_list | timeout 10 nvidia-cuda-mps-control > /dev/null 2>&1; then
        echo "MPS control daemon started (pipes in $CUDA_MPS_PIPE_DIRECTORY, logs in $CUDA_MPS_LOG_DIRECTORY)"
        exit 0
    fi
    sleep 0.2
done
echo "the MPS control daemon did not answer within 10 s; see $CUDA_MPS_LOG_DIRECTORY/control.log" >&2
exit 1
