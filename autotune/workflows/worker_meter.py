"""A study worker's energy meter: what it alone uses of a machine other workers share.

Several workers on one machine (``autotune study --workers N``, or Ray tasks with
``--cluster``) each measure their own GPU and the CPU time of their own processes: RAPL and the
machine-wide model would charge every worker for the others. Each is also charged its share of
the packages' idle draw (its cores of the machine's), as a run alone is charged it whole, so a
worker's figures and a single run's rate configs alike.
"""

from __future__ import annotations

import os
from collections.abc import Callable

from runtime.energy import EnergyMeter
from runtime.energy.cpu import CPUModelEnergy, tree_pids
from runtime.energy.cpu_idle import estimate_idle_w
from runtime.energy.gpu import NullGPUEnergy, probe_gpu_energy


def worker_meter(
    gpu: int | None, share: float = 1.0, cpu_idle_w: float | None = None
) -> Callable[[], EnergyMeter]:
    """A local worker's meter: its own GPU, the CPU time of its own processes (RAPL and the
    machine-wide model would charge every worker for the others) and ``share`` (its cores of
    the machine's) of the packages' idle draw, as a run alone is charged it whole."""

    def meter() -> EnergyMeter:
        gpu_source = NullGPUEnergy() if gpu is None else probe_gpu_energy((gpu,))
        idle = estimate_idle_w(cpu_idle_w)
        cpu = CPUModelEnergy(
            pids=lambda: tree_pids(os.getpid()),
            idle_w=idle.idle_w * min(1.0, share),
            idle_source=f"{idle.source}, x {min(1.0, share):.3g}: this worker's cores",
        )
        return EnergyMeter(gpu=gpu_source, cpu=cpu)

    return meter
