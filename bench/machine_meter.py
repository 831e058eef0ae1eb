"""Whole-machine energy sampled on a clock, so any arm's span can be charged the same way.

Every GPU NVML sees (its energy counter, or power polling where a GPU has none) and the CPU
(RAPL package counters, or the busy-core model of ``runtime/energy/cpu.py``, labelled
``model``), sampled every ``interval_s`` in a thread. Nothing here creates a CUDA context, so a
run measured with the GPU idle really has it idle.
"""

from __future__ import annotations

import bisect
import threading
import time

from runtime.energy import probe_cpu_energy, probe_gpu_energy


class MachineMeter:
    """Samples ``(unix time, GPU J, CPU J, CPU idle J)`` every ``interval_s`` between ``start``
    and ``stop``; the last is the CPU model's idle baseline (0 under RAPL, which measures the
    packages whole), so figures can be given under both CPU models."""

    def __init__(self, interval_s: float = 0.5) -> None:
        self.interval_s = interval_s
        self._gpu = probe_gpu_energy()
        self._cpu = probe_cpu_energy()
        self.samples: list[tuple[float, float, float, float]] = []
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="machine-meter", daemon=True)

    @property
    def sources(self) -> dict[str, str]:
        """``{"gpu": "nvml" | "nvml-power" | "none", "cpu": "rapl" | "model"}``."""
        gpu = sorted(set(self._gpu.sources.values())) or ["none"]
        return {"gpu": "+".join(gpu), "cpu": self._cpu.source}

    @property
    def has_idle_part(self) -> bool:
        """Whether the CPU figure is the model's, with an idle part a busy-only figure leaves
        out (RAPL measures the packages whole: no busy-only figure)."""
        return self._cpu.source != "rapl"

    def sample(self) -> None:
        """Takes a sample now (the thread takes one every ``interval_s``)."""
        with self._lock:
            gpu = sum(self._gpu.read_energy_j().values())
            cpu, idle = self._cpu.read_energy_parts_j()
            self.samples.append((time.time(), gpu, cpu, idle or 0.0))

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.sample()

    def start(self) -> MachineMeter:
        self.sample()
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
        self.sample()

    def at(self, t: float) -> tuple[float, float]:
        """GPU J and CPU J at Unix time ``t``, interpolated between the samples around it."""
        gpu, cpu, _ = self.parts_at(t)
        return gpu, cpu

    def parts_at(self, t: float) -> tuple[float, float, float]:
        """GPU J, CPU J and the CPU model's idle J at Unix time ``t`` (interpolated)."""
        if not self.samples or not self.samples[0][0] <= t <= self.samples[-1][0]:
            raise ValueError(f"time {t:.2f} is outside the sampled span")
        times = [s[0] for s in self.samples]
        i = bisect.bisect_left(times, t)
        if times[i] == t or i == 0:
            return self.samples[i][1:]
        a, b = self.samples[i - 1], self.samples[i]
        w = (t - a[0]) / (b[0] - a[0])
        ga, ca, ia = a[1:]
        gb, cb, ib = b[1:]
        return ga + w * (gb - ga), ca + w * (cb - ca), ia + w * (ib - ia)
