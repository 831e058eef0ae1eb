"""CPU energy: RAPL package counters where readable, otherwise a labelled model.

:class:`RaplEnergy` (source ``"rapl"``) reads the Linux powercap package counters, which
measure the packages whole, idle draw included. :class:`CPUModelEnergy` (source ``"model"``)
estimates energy from the packages' idle power (``runtime.energy.cpu_idle``) and busy CPU
time; its figures are a model, not a measurement. :func:`probe_cpu_energy` picks one.
"""

from __future__ import annotations

import functools
import logging
import re
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil

from runtime.energy.cpu_idle import estimate_idle_w

logger = logging.getLogger(__name__)

DEFAULT_POWERCAP_ROOT = Path("/sys/class/powercap")

DEFAULT_WATTS_PER_BUSY_CORE = 10.0
"""Watts charged per busy core by :class:`CPUModelEnergy`.

Where the number comes from: a rough per-core dynamic power figure for current
server CPUs (a package's TDP above idle, roughly 150-350 W, divided by its 16-64
cores lands around 5-15 W per fully busy core). It is an assumption, not a
measurement of this machine; pass ``watts_per_busy_core`` to override it.
"""

_PACKAGE_DIR = re.compile(r"^intel-rapl:\d+$")
_BUSY_FIELDS = ("user", "nice", "system", "irq", "softirq", "steal")


class CPUEnergyError(RuntimeError):
    """CPU energy cannot be read from the requested source."""


class CPUEnergySource:
    """Base interface of a CPU energy source.

    Attributes:
        source: ``"rapl"`` or ``"model"``.
    """

    source: str = "model"

    def read_energy_j(self) -> float:
        """Returns cumulative joules since an arbitrary, fixed origin."""
        raise NotImplementedError

    def read_energy_parts_j(self) -> tuple[float, float | None]:
        """Returns cumulative joules and, of them, the modelled idle baseline's joules.

        The second is None for a source with no such part: one that measures the packages
        whole (RAPL), whose figure has no busy-only counterpart.
        """
        return self.read_energy_j(), None

    def describe(self) -> dict[str, Any] | None:
        """How the figures are modelled, for the result document; None for a measurement."""
        return None

    def close(self) -> None:
        """Releases resources; nothing to release by default."""


class RaplEnergy(CPUEnergySource):
    """Sums the RAPL package counters under a powercap root.

    Only top-level zones ``intel-rapl:N`` are read (subzones ``intel-rapl:N:M``
    are parts of a package and would double count). Zones whose ``name`` is not
    ``package-*`` (such as ``psys``, which overlaps the packages) are skipped.
    Wrap-around is undone with ``max_energy_range_uj``, which assumes at least one
    read per wrap period (minutes at full load on typical parts).

    Args:
        powercap_root: Directory holding the ``intel-rapl:*`` zones.

    Raises:
        CPUEnergyError: If there are no package zones or any counter is unreadable.
    """

    source = "rapl"

    def __init__(self, powercap_root: str | Path = DEFAULT_POWERCAP_ROOT) -> None:
        root = Path(powercap_root)
        self.zones: list[Path] = []
        try:
            candidates = sorted(p for p in root.iterdir() if _PACKAGE_DIR.match(p.name))
        except OSError as exc:
            raise CPUEnergyError(f"cannot list RAPL zones in {root}: {exc}") from exc
        for zone in candidates:
            try:
                name = (zone / "name").read_text().strip()
            except OSError:
                name = "package"
            if name.startswith("package"):
                self.zones.append(zone)
        if not self.zones:
            raise CPUEnergyError(f"no RAPL package zones in {root}")
        self._max_uj = {z: self._read_int(z / "max_energy_range_uj") for z in self.zones}
        self._last_uj = {z: self._read_int(z / "energy_uj") for z in self.zones}
        self._total_uj = 0
        self._lock = threading.Lock()

    @staticmethod
    def _read_int(path: Path) -> int:
        try:
            return int(path.read_text().strip())
        except (OSError, ValueError) as exc:
            raise CPUEnergyError(f"cannot read RAPL counter {path}: {exc}") from exc

    def read_energy_j(self) -> float:
        """Returns package energy in joules since construction, summed over packages.

        Raises:
            CPUEnergyError: If a counter becomes unreadable.
        """
        with self._lock:
            for zone in self.zones:
                now_uj = self._read_int(zone / "energy_uj")
                delta_uj = now_uj - self._last_uj[zone]
                if delta_uj < 0:
                    delta_uj += self._max_uj[zone]
                self._total_uj += delta_uj
                self._last_uj[zone] = now_uj
            return self._total_uj / 1e6


def tree_pids(root: int) -> list[int]:
    """``root`` and every descendant alive now (for ``CPUModelEnergy(pids=...)``)."""
    try:
        proc = psutil.Process(root)
        return [root, *(c.pid for c in proc.children(recursive=True))]
    except psutil.NoSuchProcess:
        return []


class CPUModelEnergy(CPUEnergySource):
    """Models CPU energy as ``idle_w * elapsed_s + watts_per_busy_core * busy_core_seconds``.

    The idle term charges the packages' idle draw for every second of wall time since
    construction, busy or not, as the GPU's measured energy charges the GPU's; without it
    (``idle_w=0``, the busy-only model) a configuration that leaves cores idle looks cheaper
    than it is. :func:`probe_cpu_energy` sets ``idle_w`` from
    :func:`runtime.energy.cpu_idle.estimate_idle_w`; built directly it defaults to 0.
    ``read_energy_parts_j`` returns the idle term's joules too, so the busy-only figure is
    the total less them.

    System-wide (``pids`` is ``None``), busy core-seconds are deltas of
    ``psutil.cpu_times()`` over every state except idle and iowait:
    user + nice + system + irq + softirq + steal (on Linux guest time is already
    inside user and is not added again). With ``pids``, they are the summed
    ``cpu_times()`` of those processes: user + system + children_user +
    children_system (the times of children they reaped, which no read saw alive). A
    listed process that vanishes while its parent is listed and alive was reaped by it:
    its times (to its exit) are in the parent's children times from then on, and its
    last-read times stop counting on their own, so nothing is counted twice. One whose
    parent is not listed (re-parented to init, or the root) keeps its last value. The
    counter never goes backwards.

    Uncore power above idle is not modelled. Figures are labelled ``"model"`` and
    are estimates, not measurements.

    Args:
        watts_per_busy_core: Power charged per busy core, in watts.
        pids: Callable returning the process ids to account, or ``None`` for the
            whole system.
        idle_w: Idle power of the packages, in watts (0: the busy-only model).
        idle_source: Where ``idle_w`` came from (``IdleEstimate.source``).
        clock: Monotonic seconds for the idle term (injectable for tests).
        children: With ``pids``, also count each process's reaped children's times (False
            when ``pids`` lists every process of a tree that lives long enough to be read:
            a child's own times are counted, and its parent's reaping would count them twice).

    Raises:
        ValueError: If ``idle_w`` is negative.
    """

    source = "model"

    def __init__(
        self,
        watts_per_busy_core: float = DEFAULT_WATTS_PER_BUSY_CORE,
        pids: Callable[[], list[int]] | None = None,
        idle_w: float = 0.0,
        idle_source: str = "none: busy cores only",
        clock: Callable[[], float] = time.monotonic,
        children: bool = True,
    ) -> None:
        if not idle_w >= 0:
            raise ValueError(f"idle_w={idle_w!r}: must be a number of watts >= 0")
        self.watts_per_busy_core = watts_per_busy_core
        self.idle_w = float(idle_w)
        self.idle_source = idle_source
        self._pids = pids
        self._children = children
        self._clock = clock
        self._lock = threading.Lock()
        self._procs: dict[tuple[int, float], tuple[float, float, int]] = {}
        """Each process read: (own busy seconds, its reaped children's, its parent's pid)."""
        self._reaped: dict[tuple[int, float], float] = {}
        """Processes gone whose times their listed parent's children times now hold."""
        self._last_busy_s = 0.0
        self._origin_busy_s = self._busy_core_s()
        self._origin_s = clock()

    def _system_busy_s(self) -> float:
        times = psutil.cpu_times()
        return sum(getattr(times, name, 0.0) for name in _BUSY_FIELDS)

    def _process_busy_s(self, pids: list[int]) -> float:
        seen: set[tuple[int, float]] = set()
        for pid in pids:
            try:
                proc = psutil.Process(pid)
                with proc.oneshot():
                    key, t, ppid = (pid, proc.create_time()), proc.cpu_times(), proc.ppid()
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
            kids = getattr(t, "children_user", 0.0) + getattr(t, "children_system", 0.0)
            own0, kids0, _ = self._procs.get(key, (0.0, 0.0, ppid))
            self._procs[key] = (max(t.user + t.system, own0), max(kids, kids0), ppid)
            seen.add(key)
        if self._children:
            alive = {pid for pid, _ in seen}
            for key, (own, kids, ppid) in self._procs.items():
                if key not in seen and key not in self._reaped and ppid in alive:
                    self._reaped[key] = own + kids  # its parent's children times hold it now
        kids_on = 1.0 if self._children else 0.0
        total = sum(own + kids_on * kids for own, kids, _ in self._procs.values())
        return total - sum(self._reaped.values())

    def _busy_core_s(self) -> float:
        busy_s = self._system_busy_s() if self._pids is None else self._process_busy_s(self._pids())
        self._last_busy_s = max(busy_s, self._last_busy_s)
        return self._last_busy_s

    def read_energy_parts_j(self) -> tuple[float, float]:
        """Returns modelled joules since construction and, of them, the idle term's."""
        with self._lock:
            busy_j = self.watts_per_busy_core * (self._busy_core_s() - self._origin_busy_s)
            idle_j = self.idle_w * (self._clock() - self._origin_s)
        return busy_j + idle_j, idle_j

    def read_energy_j(self) -> float:
        """Returns modelled energy in joules since construction (idle term included)."""
        return self.read_energy_parts_j()[0]

    def describe(self) -> dict[str, Any]:
        """The model's name, watts per busy core, idle watts and where they came from."""
        return {
            "name": "busy-cores+idle" if self.idle_w > 0 else "busy-cores",
            "watts_per_busy_core": self.watts_per_busy_core,
            "idle_w": self.idle_w,
            "idle_source": self.idle_source,
        }


@functools.cache
def probe_cpu_energy(
    powercap_root: str | Path = DEFAULT_POWERCAP_ROOT, idle_w: float | None = None
) -> CPUEnergySource:
    """Returns RAPL when every package counter is readable, else the model.

    RAPL measures the packages whole, so it gets no idle term and ``idle_w`` is
    ignored there. The model charges ``idle_w`` (None: from the CPU's TDP, see
    :func:`runtime.energy.cpu_idle.estimate_idle_w`) plus its busy cores. The
    choice is cached per argument, so the fallback is logged once.

    Args:
        powercap_root: Directory holding the ``intel-rapl:*`` zones.
        idle_w: The packages' idle watts for the model (``TrainConfig.cpu_idle_w``).

    Returns:
        A shared :class:`RaplEnergy` or :class:`CPUModelEnergy`.
    """
    try:
        rapl = RaplEnergy(powercap_root)
    except CPUEnergyError as exc:
        idle = estimate_idle_w(idle_w)
        logger.info(
            "CPU energy: RAPL unavailable (%s); using the model: %.1f W idle (%s) + %.1f W per "
            "busy core (estimates labelled 'model', not measurements)",
            exc,
            idle.idle_w,
            idle.source,
            DEFAULT_WATTS_PER_BUSY_CORE,
        )
        return CPUModelEnergy(idle_w=idle.idle_w, idle_source=idle.source)
    logger.info("CPU energy: RAPL package counters %s", [z.name for z in rapl.zones])
    if idle_w is not None:
        logger.info("cpu_idle_w=%s ignored: RAPL measures the packages, idle included", idle_w)
    return rapl
