"""Where each trainer GMI runs: its GPU, its MPS active-thread percentage, and its rank.

Ranks are assigned GPU-major: with ``trainers=2`` on GPUs ``(0, 1)`` ranks 0 and 1 share GPU 0
and ranks 2 and 3 share GPU 1, so the gradient-sync layout is ``[[0, 1], [2, 3]]``. On the CPU
all GMIs form one group (``[[0, ..., n-1]]``), which Algorithm 1 maps to multi-process
reduction.

How GMIs share a GPU (``sharing``):

* ``mps``: an MPS daemon runs; each GMI is an MPS client limited to its percentage.
* ``shared``: MPS was wanted (several GMIs on a GPU, or a percentage below 100) but could not
  start; GMIs run as plain processes time-sliced by the driver and no percentage applies.
* ``exclusive``: one GMI per GPU with no percentage, so no MPS is needed.
* ``cpu``: the trainers run on the CPU.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass

from runtime.config import TrainConfig, mps_pct_problem


@dataclass(frozen=True)
class GMISpec:
    """One trainer GMI of a run.

    Attributes:
        rank: Global rank in the data-parallel group (0 publishes the weights).
        gpu: CUDA device index, or None on the CPU.
        mps_pct: Requested MPS active-thread percentage, or None for no limit.
    """

    rank: int
    gpu: int | None
    mps_pct: int | None

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


def place(cfg: TrainConfig, mps_pct: tuple[int, ...] | None = None) -> list[GMISpec]:
    """The GMIs of ``cfg`` (validated), optionally with other percentages (a hand-over).

    Args:
        cfg: The run's configuration.
        mps_pct: Overrides ``cfg.mps_pct``: one value for all GMIs or one per GMI.

    Raises:
        ValueError: if ``mps_pct`` has the wrong length or a value outside 1..100.
    """
    pct = cfg.mps_pct if mps_pct is None else tuple(mps_pct)
    if cfg.resolved_device() != "cuda":
        if mps_pct is not None:
            raise ValueError("MPS percentages apply to cuda trainer GMIs; these run on the CPU")
        return [GMISpec(rank, None, None) for rank in range(cfg.trainers)]
    n = cfg.gmi_count()
    if pct is not None:
        problem = mps_pct_problem(pct, n)
        if problem:
            raise ValueError(f"MPS percentages {problem}")
        pct = pct * n if len(pct) == 1 else pct
    specs = []
    for g, gpu in enumerate(cfg.gpu_list()):
        for i in range(cfg.trainers):
            rank = g * cfg.trainers + i
            specs.append(GMISpec(rank, gpu, None if pct is None else pct[rank]))
    return specs


def layout(specs: list[GMISpec]) -> list[list[int]]:
    """Per GPU (in first-seen order), the ranks on it; one group on the CPU."""
    groups: dict[int | None, list[int]] = {}
    for spec in specs:
        groups.setdefault(spec.gpu, []).append(spec.rank)
    return list(groups.values())


def wants_mps(specs: list[GMISpec]) -> bool:
    """Whether MPS is needed: a percentage below 100, or two GMIs on one GPU."""
    on_gpu = [s for s in specs if s.gpu is not None]
    if any(s.mps_pct is not None and s.mps_pct < 100 for s in on_gpu):
        return True
    return len({s.gpu for s in on_gpu}) < len(on_gpu)


def bind_gpu(gpu: int | None, env: dict[str, str]) -> None:
    """In a GMI process, before CUDA starts: applies ``env`` (the MPS client variables) and
    makes ``gpu`` the only visible device (indices are relative to the runner's
    ``CUDA_VISIBLE_DEVICES`` when it has one)."""
    os.environ.update(env)
    if gpu is None:
        return
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    os.environ["CUDA_VISIBLE_DEVICES"] = visible.split(",")[gpu] if visible else str(gpu)
