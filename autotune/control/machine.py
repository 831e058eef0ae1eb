"""The machine as the daemon sees it: the cores it may hand out, the GPUs, the energy meters,
and what jobs it does not manage already take.

* **Cores**: the daemon's own CPU affinity mask, less the cores kept back for it where asked
  (none by default: the daemon mostly sleeps, and a core kept for it would idle, as one left to
  a job's stages did). Each job's budget includes the cores its stages run on.
* **GPUs**: NVML's list (name, memory, MIG mode), less those ``CUDA_VISIBLE_DEVICES`` leaves
  out where it is set (``runtime.hw.gpus.visible``), the SM count of each as a short-lived CUDA
  process reads it, paired with NVML's GPU by UUID (the daemon never holds a CUDA context),
  and whether MPS can run there: the control binary is installed and the GPU is not in MIG mode.
* **Meters**: the GPU energy counter where NVML has it, and RAPL or the labelled CPU model.
* **Foreign load**: processes the daemon does not manage (a wrapped script in restart mode, a
  process on the GPU) are seen through psutil and NVML. The cores they keep busy count as
  taken, and those a busy process is pinned to are handed out last; the GPUs they hold are
  shown (an MPS share cannot be set aside for a process outside MPS).

Tests describe machines with ``MachineView.from_dict``; nothing here changes any setting.
"""

from __future__ import annotations

import logging
import os
import shutil
from dataclasses import asdict, dataclass, field, replace
from typing import Any

logger = logging.getLogger(__name__)

BUSY_CORE_SHARE = 0.5
"""A foreign process using at least this share of a core counts one core as taken."""
MPS_PROCESSES = ("nvidia-cuda-mps-server", "nvidia-cuda-mps-control")


@dataclass(frozen=True)
class GPUView:
    """One GPU as the allocator uses it."""

    index: int
    name: str
    sms: int
    memory_mib: int
    mig: str = "disabled"
    mps: bool = True
    """Whether GMIs can share it through MPS (else a job's GMIs run as plain processes)."""


@dataclass(frozen=True)
class MachineView:
    """What the daemon may hand out (see the module docstring)."""

    cores: tuple[int, ...]
    """The cores jobs may be given (the affinity mask less the reserve), ascending."""
    reserved: tuple[int, ...] = ()
    gpus: tuple[GPUView, ...] = ()
    meters: dict[str, str] = field(default_factory=dict)
    """``{"gpu": "nvml" | "none", "cpu": "rapl" | "model"}``."""
    online: int | None = None
    """Every online core of the machine, in the daemon's mask or not (the CPU meters read the
    whole packages); None: as many as ``cores`` and ``reserved``."""

    def __post_init__(self) -> None:
        if not self.cores:
            raise ValueError("a machine needs at least one core to hand out")
        if len(set(self.cores)) != len(self.cores) or set(self.cores) & set(self.reserved):
            raise ValueError(f"cores {self.cores} and reserve {self.reserved} overlap or repeat")

    @property
    def gpu_ids(self) -> list[int]:
        return [g.index for g in self.gpus]

    def gpu(self, index: int) -> GPUView:
        for g in self.gpus:
            if g.index == index:
                return g
        raise ValueError(f"no GPU {index}; this machine has {[g.index for g in self.gpus]}")

    def to_dict(self) -> dict[str, Any]:
        return {
            "cores": list(self.cores),
            "reserved": list(self.reserved),
            "gpus": [asdict(g) for g in self.gpus],
            "meters": dict(self.meters),
            "online": self.online,
        }

    @classmethod
    def from_dict(cls, doc: dict[str, Any]) -> MachineView:
        """A machine description (``to_dict``'s form; ``cores`` may be a count)."""
        cores = doc["cores"]
        cores = tuple(range(cores)) if isinstance(cores, int) else tuple(int(c) for c in cores)
        return cls(
            tuple(sorted(cores)),
            tuple(int(c) for c in doc.get("reserved", ())),
            tuple(GPUView(**g) for g in doc.get("gpus", ())),
            dict(doc.get("meters", {})),
            None if doc.get("online") is None else int(doc["online"]),
        )


def reserve_problem(reserve: int | None) -> str | None:
    """Why ``reserve`` cores cannot be kept back for the daemon here (what is allowed), or
    None."""
    mask = sorted(os.sched_getaffinity(0))
    keep = reserve or 0
    if 0 <= keep < len(mask):
        return None
    return (
        f"a reserve of {keep} cores: allowed are 0..{len(mask) - 1}, which leave jobs at "
        f"least one of the {len(mask)} cores in the affinity mask {mask}"
    )


def detect(reserve: int | None = None, sms: bool = True) -> MachineView:
    """This machine, read now (NVML, the affinity mask, one short CUDA query for SMs).

    Args:
        reserve: Cores kept back for the daemon (None: none).
        sms: Read the SM counts (a short-lived CUDA process; False leaves them 0).

    Raises:
        ValueError: the reserve leaves no core to hand out.
    """
    from runtime.energy.cpu import probe_cpu_energy
    from runtime.hw.gpus import list_gpus, sm_counts_of, visible

    mask = sorted(os.sched_getaffinity(0))
    keep = reserve or 0
    if why := reserve_problem(keep):
        raise ValueError(why)
    reserved, cores = tuple(mask[:keep]), tuple(mask[keep:])
    nv = visible(list_gpus())  # CUDA_VISIBLE_DEVICES keeps the daemon to the GPUs it names
    counts = sm_counts_of(nv) if nv and sms else {}
    mps_binary = shutil.which("nvidia-cuda-mps-control") is not None
    gpus = tuple(
        GPUView(
            g.index,
            g.name,
            counts.get(g.index, 0),
            g.memory_total_mib,
            g.mig_mode,
            mps_binary and g.mig_mode != "enabled",
        )
        for g in nv
    )
    meters = {
        "gpu": "nvml" if any(g.energy_counter for g in nv) else "none",
        "cpu": probe_cpu_energy().source,
    }
    return MachineView(cores, reserved, gpus, meters, os.cpu_count())


def foreign_load(managed: set[int], cores: tuple[int, ...]) -> dict[str, Any]:
    """What processes outside ``managed`` (the daemon's and its jobs' process trees) take:
    ``{"cores": n, "pinned": [core, ...], "gpus": [index, ...], "pids": [...]}``. ``cores``
    counts their CPU use among ``cores`` in whole cores (a process using ``BUSY_CORE_SHARE``
    of a core or more counts its use rounded, at least one); ``pinned`` are the cores such a
    process is confined to where its affinity is narrower than ``cores`` (the kernel moves an
    unconfined one about); ``gpus`` are the GPUs where one holds a compute context (MPS's own
    server, which carries the managed jobs' GMIs, does not count).

    CPU use is psutil's, over the interval since the previous call (the first call reads 0)."""
    import psutil

    from runtime.hw.gpus import gpus_used_by

    busy, pids, others, pinned = 0.0, [], [], set()
    allowed = set(cores)
    for proc in psutil.process_iter(["pid", "name", "cpu_affinity"]):
        pid = proc.info["pid"]
        if pid in managed or pid == os.getpid() or proc.info["name"] in MPS_PROCESSES:
            continue
        others.append(pid)
        try:
            share = proc.cpu_percent(None) / 100.0
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        affinity = proc.info.get("cpu_affinity") or list(allowed)
        if share >= BUSY_CORE_SHARE and allowed & set(affinity):
            busy += max(1, round(share))  # a multithreaded process can keep several busy
            pids.append(pid)
            if not allowed <= set(affinity):
                pinned |= allowed & set(affinity)
    gpus = sorted(gpus_used_by(others))
    return {"cores": int(busy), "pinned": sorted(pinned), "gpus": gpus, "pids": pids}


def busy_last(machine: MachineView, pinned: list[int]) -> MachineView:
    """``machine`` with the ``pinned`` cores (``foreign_load``) last among its cores: the
    allocator hands cores out in that order, so jobs get them only where nothing else is left,
    and a job that shrinks gives them up first. A process pinned later does not by itself move
    a job: the periodic share-out changes budgets only where it predicts more steps/J."""
    last = set(pinned)
    return replace(machine, cores=tuple(sorted(machine.cores, key=lambda k: k in last)))


def energy_shares(machine: MachineView, budget: Any) -> dict[str, Any]:
    """The shares of the machine's energy a job with ``budget`` (``allocator.Budget``) is
    charged (``runtime.energy.shares``): its cores of the machine's (all those online less the
    daemon's reserve: where the daemon's mask is part of the machine, as a second daemon's on
    the other cores or a container's cpuset, the packages' idle draw or RAPL's whole reading
    is not charged twice), and its MPS share of its GPU (``gpu_index``; none of the others)."""
    gpu = 0.0 if budget.gpu is None else (budget.mps_pct or 0) / 100.0
    machine_cores = max(len(machine.cores), (machine.online or 0) - len(machine.reserved))
    return {
        "cpu_share": len(budget.cores) / machine_cores,
        "gpu_share": gpu,
        "gpu_index": budget.gpu,
    }


def process_trees(pids: set[int]) -> set[int]:
    """``pids`` and every process under them."""
    import psutil

    out = set(pids)
    for pid in pids:
        try:
            out |= {c.pid for c in psutil.Process(pid).children(recursive=True)}
        except (psutil.Error, ValueError):
            continue
    return out
