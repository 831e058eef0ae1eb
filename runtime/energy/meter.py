"""Energy measurement windows over GPU and CPU sources (Zeus ``begin/end_window``).

Usage::

    meter = EnergyMeter()
    meter.begin_window("trial-3")
    ...  # run the workload
    m = meter.end_window("trial-3")
    steps_per_j = steps / m.total_j

Windows are keyed by name; different keys may overlap or nest. Each window
costs one read of every source at its begin and one at its end.

A source whose read fails (an NVML or RAPL hiccup) after one that worked is taken at its last
reading for that snapshot, and the miss is counted (``read_errors``) and logged: the sources
are cumulative counters, so the next good read makes up what was missed, and a window is lost
only in the share of energy its end could not read. A window ends whether or not its end could
be read.

Accuracy notes:

* The NVML energy counter updates about every 100 ms, so GPU figures from
  windows shorter than about 10 s carry a large relative error (the design
  calls for windows of at least 10 s). Power polling has a similar granularity.
* CPU figures whose ``cpu_source`` is ``"model"`` are estimates from the
  packages' idle power and busy CPU time (see
  :class:`runtime.energy.cpu.CPUModelEnergy`), not measurements; such a window
  also carries the idle term's joules, so the busy-only model's figure is known
  too. Only ``"rapl"`` figures are measured, and they have no busy-only figure.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from runtime.energy.cpu import CPUEnergyError, CPUEnergySource, probe_cpu_energy
from runtime.energy.gpu import GPUEnergyError, GPUEnergySource, probe_gpu_energy

logger = logging.getLogger(__name__)

MIN_GPU_WINDOW_S = 10.0
"""Shortest window whose GPU figures are trustworthy given NVML's ~100 ms updates."""


@dataclass(frozen=True)
class Measurement:
    """Energy used during one window.

    Attributes:
        elapsed_s: Wall-clock (monotonic) length of the window in seconds.
        gpu_energy_j: Joules per GPU, keyed by NVML index.
        cpu_energy_j: CPU joules (measured for ``"rapl"``, modelled for ``"model"``,
            the idle term included).
        gpu_source: ``"nvml"``, ``"nvml-power-polling"`` or ``"none"``.
        cpu_source: ``"rapl"`` or ``"model"``.
        cpu_idle_j: Of ``cpu_energy_j``, the modelled idle term's joules; None for a
            source without one (RAPL, measured whole).
        cpu_model: The CPU model's description (``CPUEnergySource.describe``); None
            for a measurement.
    """

    elapsed_s: float
    gpu_energy_j: dict[int, float] = field(default_factory=dict)
    cpu_energy_j: float = 0.0
    gpu_source: str = "none"
    cpu_source: str = "model"
    cpu_idle_j: float | None = None
    cpu_model: dict[str, Any] | None = None

    @property
    def gpu_total_j(self) -> float:
        """Joules summed over all GPUs."""
        return sum(self.gpu_energy_j.values())

    @property
    def total_j(self) -> float:
        """GPU plus CPU joules."""
        return self.gpu_total_j + self.cpu_energy_j

    @property
    def cpu_busy_only_j(self) -> float | None:
        """CPU joules of the busy-only model (without the idle term); None without a model."""
        return None if self.cpu_idle_j is None else self.cpu_energy_j - self.cpu_idle_j

    @property
    def gpu_power_w(self) -> float:
        """Mean GPU power over the window in watts (0 for an empty window)."""
        return self.gpu_total_j / self.elapsed_s if self.elapsed_s > 0 else 0.0

    @property
    def cpu_power_w(self) -> float:
        """Mean CPU power over the window in watts (0 for an empty window)."""
        return self.cpu_energy_j / self.elapsed_s if self.elapsed_s > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        """Returns a JSON-ready dict; ``per_gpu_j`` keys are strings so they survive JSON.

        A modelled CPU figure adds ``cpu_idle_j``, ``cpu_j_busy_only`` and ``cpu_model``;
        a measured one (RAPL) has none of them.
        """
        doc = {
            "gpu_j": self.gpu_total_j,
            "cpu_j": self.cpu_energy_j,
            "gpu_source": self.gpu_source,
            "cpu_source": self.cpu_source,
            "elapsed_s": self.elapsed_s,
            "gpu_w": self.gpu_power_w,
            "cpu_w": self.cpu_power_w,
            "per_gpu_j": {str(i): j for i, j in sorted(self.gpu_energy_j.items())},
        }
        if self.cpu_idle_j is not None:
            doc["cpu_idle_j"] = self.cpu_idle_j
            doc["cpu_j_busy_only"] = self.cpu_busy_only_j
            doc["cpu_model"] = self.cpu_model
        return doc


@dataclass(frozen=True)
class _Snapshot:
    t_s: float
    gpu_energy_j: dict[int, float]
    cpu_energy_j: float
    cpu_idle_j: float | None


class EnergyMeter:
    """Measures GPU and CPU energy over named windows.

    The meter does not own its sources and never closes them (the probed ones are
    shared process-wide).

    Args:
        gpu: GPU source; defaults to :func:`probe_gpu_energy` over all GPUs.
        cpu: CPU source; defaults to :func:`probe_cpu_energy`.
    """

    def __init__(
        self, gpu: GPUEnergySource | None = None, cpu: CPUEnergySource | None = None
    ) -> None:
        self.gpu = gpu if gpu is not None else probe_gpu_energy()
        self.cpu = cpu if cpu is not None else probe_cpu_energy()
        self._open: dict[str, _Snapshot] = {}
        self._lock = threading.Lock()
        self._last: tuple[dict[int, float], tuple[float, float | None]] | None = None
        self.read_errors = 0
        """Reads of a source that failed and were taken at its last reading."""

    @property
    def open_windows(self) -> list[str]:
        """Keys of the windows begun and not yet ended, in begin order."""
        with self._lock:
            return list(self._open)

    def _snapshot(self) -> _Snapshot:
        gpu = self._read(self.gpu.read_energy_j, 0)
        cpu_j, cpu_idle_j = self._read(self.cpu.read_energy_parts_j, 1)
        self._last = (gpu, (cpu_j, cpu_idle_j))
        return _Snapshot(time.monotonic(), gpu, cpu_j, cpu_idle_j)

    def _read(self, read: Any, which: int) -> Any:
        """``read()``, or where it fails after a reading worked, that source's last reading."""
        try:
            return read()
        except (GPUEnergyError, CPUEnergyError) as exc:
            if self._last is None:
                raise
            self.read_errors += 1
            log = logger.warning if self.read_errors in (1, 10, 100) else logger.debug
            log(
                "energy read failed (%s), taken at its last reading (%d so far)",
                exc,
                self.read_errors,
            )
            return self._last[which]

    def begin_window(self, key: str) -> None:
        """Starts the window ``key``.

        Raises:
            ValueError: If a window named ``key`` is already open.
        """
        with self._lock:
            if key in self._open:
                raise ValueError(
                    f"energy window {key!r} is already open; open windows: {list(self._open)}"
                )
            self._open[key] = self._snapshot()

    def end_window(self, key: str) -> Measurement:
        """Ends the window ``key`` and returns what it used.

        Raises:
            ValueError: If no window named ``key`` is open.
        """
        return self._measure(key, close=True)

    def peek_window(self, key: str) -> Measurement:
        """What the window ``key`` has used so far; it stays open.

        Raises:
            ValueError: If no window named ``key`` is open.
        """
        return self._measure(key, close=False)

    def _measure(self, key: str, close: bool) -> Measurement:
        with self._lock:
            if key not in self._open:
                raise ValueError(
                    f"energy window {key!r} is not open; open windows: {list(self._open)}"
                )
            start = self._open[key]
            try:
                end = self._snapshot()
            finally:  # ended whether or not its end could be read
                if close:
                    del self._open[key]
        elapsed_s = end.t_s - start.t_s
        if self.gpu.source != "none" and elapsed_s < MIN_GPU_WINDOW_S:
            logger.debug(
                "Window %r lasted %.2f s (< %.0f s); GPU energy is coarse",
                key,
                elapsed_s,
                MIN_GPU_WINDOW_S,
            )
        gpu_energy_j = {
            i: end.gpu_energy_j[i] - start.gpu_energy_j[i]
            for i in end.gpu_energy_j
            if i in start.gpu_energy_j
        }
        cpu_idle_j = None
        if end.cpu_idle_j is not None and start.cpu_idle_j is not None:
            cpu_idle_j = end.cpu_idle_j - start.cpu_idle_j
        return Measurement(
            elapsed_s=elapsed_s,
            gpu_energy_j=gpu_energy_j,
            cpu_energy_j=end.cpu_energy_j - start.cpu_energy_j,
            gpu_source=self.gpu.source,
            cpu_source=self.cpu.source,
            cpu_idle_j=cpu_idle_j,
            cpu_model=self.cpu.describe() if cpu_idle_j is not None else None,
        )
