"""Which GPU a job that names none gets, on a machine of several.

A tuned job started without ``--gpus`` claims any GPU (``"gpu": "any"``). The daemon picks one
when the job first asks: of the GPUs where MPS can run (all of them where none can), the one
where it would be admitted and its share would be largest, that is the GPU's share not fixed
to jobs, split by weight among the flexible jobs there and it (a fixed share: where the most
is left besides it); of equal ones the lowest index. The job keeps that GPU while it runs: a
GMI moved to another GPU would need a new run, not a hand-over.
"""

from __future__ import annotations

from dataclasses import replace

from autotune.control.allocator import Claim, check_admission
from autotune.control.machine import MachineView


def pick_gpu(
    machine: MachineView, claims: list[Claim], new: Claim, foreign: frozenset[int] = frozenset()
) -> Claim:
    """``new`` with its GPU chosen among ``machine``'s beside ``claims`` (the jobs that hold
    GPUs already), a GPU where a process the daemon does not manage computes (``foreign``,
    NVML indices) only where every other is worse for MPS; unchanged where it names a GPU,
    or the machine has none."""
    if not new.any_gpu or not machine.gpus:
        return new
    own = new.fixed.mps_pct or 0 if new.fixed is not None else 0

    def share(gpu: int) -> float:
        fixed = sum(c.fixed.mps_pct or 0 for c in claims if c.fixed and c.fixed.gpu == gpu)
        weight = sum(c.weight for c in claims if c.fixed is None and c.gpu == gpu)
        room = 100 - fixed - own
        return room if new.fixed is not None else room * new.weight / (weight + new.weight)

    def on(gpu: int) -> Claim:
        fixed = None if new.fixed is None else replace(new.fixed, gpu=gpu)
        return replace(new, gpu=gpu, any_gpu=False, fixed=fixed)

    # where it would be admitted (each job there keeps a share a GMI runs at), if anywhere;
    # else the best of all, for admission to refuse saying what is free
    fits = [g for g in machine.gpus if check_admission(machine, claims, on(g.index)) is None]
    best = max(
        fits or machine.gpus,
        key=lambda g: (g.mps, g.index not in foreign, share(g.index), -g.index),
    )
    return on(best.index)
