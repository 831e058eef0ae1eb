"""A job's share of the machine's energy while it shares the machine with other jobs.

A job alone is charged the whole machine: the GPU's energy counter (idle draw included) and
the CPU packages' idle draw plus every busy core. Jobs that share a machine under the daemon
(``autotune.control.sharing``) would each be charged everyone's energy that way, so each is
charged its share instead, as its budget sets it:

* GPU: the energy of the job's GPU times its share of that GPU's SMs (its MPS share), and
  nothing of the machine's other GPUs;
* CPU under the model: the job's own busy cores (its process tree) plus the packages' idle
  draw times its share of the machine's cores (all online less the daemon's reserve,
  ``autotune.control.machine.energy_shares``); under RAPL (the packages measured whole), the
  packages' energy times that share.

Where the daemon hands out every core, the shares sum to one over the jobs, so the jobs' figures
add up to the machine's; a daemon on part of the machine charges its jobs only that part's
share of the packages, so two daemons on disjoint cores never charge them twice. Shares change
with the budget; the charge is integrated over time (between two readings at the share of the
later one), so a change applies from the reading after it. A meter whose shares are both 1
reads exactly as its sources.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any

from runtime.energy.cpu import CPUEnergySource, CPUModelEnergy, tree_pids
from runtime.energy.gpu import GPUEnergySource


class SharedGPU(GPUEnergySource):
    """``inner``'s joules per GPU, times ``share``, or with ``per_gpu`` set, times each GPU's
    share there (0 for a GPU it does not name: the job's GMIs run on another)."""

    def __init__(self, inner: GPUEnergySource) -> None:
        super().__init__(inner.gpu_indices)
        self.inner, self.source, self.share = inner, inner.source, 1.0
        self.per_gpu: dict[int, float] | None = None
        self._last: dict[int, float] | None = None
        self._acc: dict[int, float] = {}
        self._lock = threading.Lock()

    @property
    def sources(self) -> dict[int, str]:
        return self.inner.sources

    def read_energy_j(self) -> dict[int, float]:
        with self._lock:
            now = self.inner.read_energy_j()
            last = self._last if self._last is not None else now
            for i, j in now.items():
                f = self.share if self.per_gpu is None else self.per_gpu.get(i, 0.0)
                self._acc[i] = self._acc.get(i, 0.0) + (j - last.get(i, j)) * f
            self._last = now
            return dict(self._acc)

    def close(self) -> None:
        self.inner.close()


class SharedCPU(CPUEnergySource):
    """``inner``'s joules while ``share`` is 1; below it, this job's busy cores and ``share``
    of the idle draw (the model), or ``share`` of the packages (RAPL). ``reaped``: the job's
    busy cores include the children its processes have reaped, for a window that no reading
    sees them live in (a probe run by ``subprocess.run`` between two readings); a long window
    that reads its children live would count them twice so."""

    def __init__(
        self, inner: CPUEnergySource, root: int | None = None, reaped: bool = False
    ) -> None:
        self.inner, self.source, self.share = inner, inner.source, 1.0
        watts = getattr(inner, "watts_per_busy_core", None)
        root = os.getpid() if root is None else root
        self.own = (
            CPUModelEnergy(watts, pids=lambda: tree_pids(root), children=reaped)
            if watts is not None
            else None
        )
        self._last: tuple[float, float | None, float | None] | None = None
        self._acc = [0.0, 0.0]
        self.changes: list[dict[str, float]] = []
        self._lock = threading.Lock()

    def _read(self) -> tuple[float, float | None, float | None]:
        total, idle = self.inner.read_energy_parts_j()
        # the job's own tree is read only while it shares the machine (a psutil walk per read)
        own = self.own.read_energy_j() if self.own is not None and self.share < 1.0 else None
        return total, idle, own

    def read_energy_parts_j(self) -> tuple[float, float | None]:
        with self._lock:
            now = self._read()
            last = self._last or now
            d_total = now[0] - last[0]
            d_own = now[2] - last[2] if now[2] is not None and last[2] is not None else 0.0
            d_idle = (now[1] - last[1]) if now[1] is not None and last[1] is not None else None
            if self.share >= 1.0:
                self._acc[0] += d_total
                self._acc[1] += d_idle or 0.0
            elif d_idle is not None:  # the model: own busy cores, a share of the idle draw
                self._acc[0] += d_own + d_idle * self.share
                self._acc[1] += d_idle * self.share
            else:  # measured packages: a share of them
                self._acc[0] += d_total * self.share
            self._last = now
            return self._acc[0], (self._acc[1] if now[1] is not None else None)

    def read_energy_j(self) -> float:
        return self.read_energy_parts_j()[0]

    def describe(self) -> dict[str, Any] | None:
        return self.inner.describe()

    def close(self) -> None:
        self.inner.close()


def set_shares(meter: Any, gpu: float, cpu: float, gpu_index: int | None = None) -> bool:
    """Charges ``meter`` (an ``EnergyMeter`` over ``SharedGPU`` and ``SharedCPU``) ``gpu`` of
    GPU ``gpu_index`` (None: of every GPU it reads) and ``cpu`` of the cores from its next
    reading; False for a meter without shares.

    Raises:
        ValueError: a share outside 0..1.
    """
    for name, v in (("gpu", gpu), ("cpu", cpu)):
        if not 0.0 <= v <= 1.0:
            raise ValueError(f"an energy share is within 0..1; {name} share {v!r}")
    shared = isinstance(meter.gpu, SharedGPU) and isinstance(meter.cpu, SharedCPU)
    per_gpu = None if gpu_index is None else {int(gpu_index): gpu}
    now = (meter.gpu.share, meter.gpu.per_gpu, meter.cpu.share) if shared else None
    if shared and now != (gpu, per_gpu, cpu):
        meter.gpu.read_energy_j()  # what was used so far goes at the old shares
        meter.cpu.read_energy_parts_j()
        meter.gpu.share, meter.gpu.per_gpu, meter.cpu.share = gpu, per_gpu, cpu
        meter.cpu.read_energy_parts_j()  # the job's own tree read from here on
        meter.cpu.changes.append({"t": time.time(), "gpu": gpu, "gpu_index": gpu_index, "cpu": cpu})
    return shared


def shares_doc(meter: Any) -> dict[str, Any] | None:
    """The shares ``meter`` was charged at, for the result: every change, with its Unix time
    (None for a meter that was never charged less than the whole machine)."""
    if not isinstance(meter.cpu, SharedCPU) or not meter.cpu.changes:
        return None
    return {
        "note": "this job's share of the machine's energy while it shared it (see "
        "runtime/energy/shares.py); the whole machine's figures are not these",
        "changes": list(meter.cpu.changes),
    }


def job_meter(
    cpu_idle_w: float | None = None, shares: dict[str, Any] | None = None, reaped: bool = False
) -> Any:
    """A job's ``EnergyMeter``: the machine's GPUs and cores, charged the job's share of them
    once shares are set (``shares``: a daemon's ``cpu_share``, ``gpu_share`` and
    ``gpu_index``, set at once; ``reaped``: see ``SharedCPU``)."""
    from runtime.energy.cpu import probe_cpu_energy
    from runtime.energy.gpu import probe_gpu_energy
    from runtime.energy.meter import EnergyMeter

    cpu = SharedCPU(probe_cpu_energy(idle_w=cpu_idle_w), reaped=reaped)
    meter = EnergyMeter(gpu=SharedGPU(probe_gpu_energy()), cpu=cpu)
    if shares:
        shares_from(meter, shares)
    return meter


def shares_from(meter: Any, doc: dict[str, Any]) -> bool:
    """``set_shares`` from a budget's plain-data shares (``gpu_share``, ``cpu_share``, 1 where
    absent; ``gpu_index``, None where absent).

    Raises:
        TypeError, ValueError: a share that is not a number within 0..1.
    """
    index = doc.get("gpu_index")
    return set_shares(
        meter,
        float(doc.get("gpu_share", 1.0)),
        float(doc.get("cpu_share", 1.0)),
        None if index is None else int(index),
    )
