"""Energy measurement: GPU energy (NVML, through ``runtime.hw.nvml``), CPU energy (RAPL or a
labelled model of idle plus busy-core power), and the meter that reads both over windows."""

from __future__ import annotations

from runtime.energy.cpu import (
    DEFAULT_POWERCAP_ROOT,
    DEFAULT_WATTS_PER_BUSY_CORE,
    CPUEnergyError,
    CPUEnergySource,
    CPUModelEnergy,
    RaplEnergy,
    probe_cpu_energy,
)
from runtime.energy.cpu_idle import IdleEstimate, estimate_idle_w
from runtime.energy.gpu import (
    POWER_POLL_INTERVAL_S,
    GPUEnergyError,
    GPUEnergySource,
    NullGPUEnergy,
    NVMLEnergy,
    NVMLPowerPollingEnergy,
    probe_gpu_energy,
)
from runtime.energy.meter import MIN_GPU_WINDOW_S, EnergyMeter, Measurement

__all__ = [
    "DEFAULT_POWERCAP_ROOT",
    "DEFAULT_WATTS_PER_BUSY_CORE",
    "MIN_GPU_WINDOW_S",
    "POWER_POLL_INTERVAL_S",
    "CPUEnergyError",
    "CPUEnergySource",
    "CPUModelEnergy",
    "EnergyMeter",
    "GPUEnergyError",
    "GPUEnergySource",
    "IdleEstimate",
    "Measurement",
    "NVMLEnergy",
    "NVMLPowerPollingEnergy",
    "NullGPUEnergy",
    "RaplEnergy",
    "estimate_idle_w",
    "probe_cpu_energy",
    "probe_gpu_energy",
]
