"""What holding a GPU costs before any work: its mean power with no CUDA context, with one idle
context, and with an idle context through MPS (the MPS server's own context besides the client's).

The physical limit steps envs with the GPU left without a context, so any trainer or inference
GMI on the GPU starts from the difference between the first two rows. Each phase runs its
holder in a child process (this process never creates a context), lets the card settle for
``--settle-s`` (before the first phase too), then charges ``--idle-s`` of the NVML energy
counter (or power polling).

    python -m bench limits --only gpu-idle --idle-s 15 --out out/limits
"""

from __future__ import annotations

import subprocess
import sys
import time
from typing import Any

from runtime.energy import probe_gpu_energy

# a child that opens a CUDA context on GPU 0, says so, and holds it until its stdin closes
HOLDER = (
    "import sys, torch; x = torch.ones(1, device='cuda'); torch.cuda.synchronize(); "
    "print('ready', flush=True); sys.stdin.read()"
)


def mean_w(seconds: float) -> dict[str, float]:
    """Each GPU's mean power over the next ``seconds`` (GPU index -> W)."""
    meter = probe_gpu_energy()
    if not meter.sources:
        raise SystemExit("no GPU that NVML can read: nothing to measure")
    t0, e0 = time.monotonic(), meter.read_energy_j()
    time.sleep(seconds)
    t1, e1 = time.monotonic(), meter.read_energy_j()
    return {str(g): round((e1[g] - e0[g]) / (t1 - t0), 2) for g in e0}


def held(
    env: dict[str, str] | None, settle_s: float, seconds: float, start_timeout_s: float = 120.0
) -> dict[str, float]:
    """Mean power while a child holds an idle context (with ``env`` added to its environment)."""
    import os
    import select

    child = subprocess.Popen(
        [sys.executable, "-c", HOLDER],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, **(env or {})},
    )
    try:
        assert child.stdout is not None and child.stdin is not None
        ready, _, _ = select.select([child.stdout], [], [], start_timeout_s)
        line = child.stdout.readline() if ready else ""
        if line.strip() != "ready":
            raise SystemExit(
                f"the context holder did not open a CUDA context within "
                f"{start_timeout_s:.0f} s (exit code {child.poll()})"
            )
        time.sleep(settle_s)
        return mean_w(seconds)
    finally:
        if child.stdin:
            child.stdin.close()
        try:
            child.wait(timeout=30)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()


def measure(seconds: float, settle_s: float, mps: bool) -> dict[str, Any]:
    if not probe_gpu_energy().sources:
        raise SystemExit("no GPU that NVML can read: nothing to measure")
    time.sleep(settle_s)  # the card may still be clocked up from work just before (89.6 W, once)
    rows: dict[str, Any] = {"no context": mean_w(seconds)}
    rows["idle context"] = held(None, settle_s, seconds)
    time.sleep(settle_s)
    rows["no context, after"] = mean_w(seconds)
    if mps:
        from runtime.hw.mps import MPSControl, MPSUnavailable

        try:
            with MPSControl() as control:
                rows["idle context through MPS"] = held(control.client_env(None), settle_s, seconds)
        except MPSUnavailable as exc:
            rows["idle context through MPS"] = f"MPS unavailable: {exc}"
    return rows
