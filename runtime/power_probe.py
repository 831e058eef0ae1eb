"""The probed GPU's watts for the probes (``runtime.probes``): idle, with a context open and
nothing running, and with the learner busy. The GPU is the one the probes' CUDA device 0 is:
GPU 0, or the first of ``CUDA_VISIBLE_DEVICES`` (a daemon's budget on another GPU sets it).
The idle and context readings span probes that leave the GPU alone (the env probes before
torch is imported; the CPU learner's probe while the CUDA learner's context is open), so they
cost no time of their own beyond ``GPU_POWER_S``."""

from __future__ import annotations

import time
from collections.abc import Callable

GPU_POWER_S = 1.0
"""Seconds each GPU power reading spans at least."""


def gpu_meter():
    """The probed GPU's energy reader (``runtime.hw.gpus.nvml_index``), or None where NVML
    cannot read it."""
    from runtime.energy.gpu import GPUEnergyError, NullGPUEnergy, probe_gpu_energy
    from runtime.hw.gpus import nvml_index

    try:
        meter = probe_gpu_energy((nvml_index(),))
    except GPUEnergyError:
        return None
    return None if isinstance(meter, NullGPUEnergy) else meter


class Reading:
    """The probed GPU's mean watts from this reading's start to ``watts()``, over whatever ran
    meanwhile."""

    def __init__(self, meter) -> None:
        self.meter = meter
        self.e0, self.t0 = sum(meter.read_energy_j().values()), time.perf_counter()

    def watts(self, least_s: float = GPU_POWER_S) -> float:
        """The mean so far, after sleeping until the reading spans ``least_s``."""
        left = least_s - (time.perf_counter() - self.t0)
        if left > 0:
            time.sleep(left)
        joules = sum(self.meter.read_energy_j().values()) - self.e0  # the one GPU it reads
        return joules / (time.perf_counter() - self.t0)


def gpu_busy_pct() -> float | None:
    """The probed GPU's utilisation now (NVML: % of its last sample period, 1/6 s to 1 s, in
    which a kernel ran, whoever ran it); None where NVML cannot read it."""
    from runtime.hw import nvml
    from runtime.hw.gpus import nvml_index

    try:
        nvml.init()
        p = nvml.pynvml
        handle = nvml.nvml_call("open the probed GPU", p.nvmlDeviceGetHandleByIndex, nvml_index())
        rates = nvml.nvml_call("read its utilisation", p.nvmlDeviceGetUtilizationRates, handle)
    except nvml.NVMLUnavailable:
        return None
    return float(rates.gpu)


def busy_watts(meter, work: Callable[[], None], seconds: float = GPU_POWER_S) -> float:
    """The probed GPU's mean watts while ``work()`` is called back to back for ``seconds``."""
    reading = Reading(meter)
    while time.perf_counter() - reading.t0 < seconds:
        work()
    return reading.watts(0.0)
