"""Which GPU a job that names none gets, on a machine of several.

A tuned job started without ``--gpus`` claims any GPU (``"gpu": "any"``). The daemon picks one
when the job first asks: of the GPUs where MPS can run (all of them where none can), the one
where the job's share would be largest, that is the GPU's share not fixed to jobs, split by
weight among the flexible jobs there and it (a fixed share: where the most is left besides it);
of equal ones the lowest index. The job keeps that GPU while it runs: a GMI moved to another GPU
would need a new run, not a hand-over. Before this, every such job shared GPU 0.
"""

from __future__ import annotations

from dataclasses import replace

from autotune.control.allocator import Claim
from autotune.control.machine import MachineView


def pick_gpu(machine: MachineView, claims: list[Claim], new: Claim) -> Claim:
    """``new`` with its GPU chosen among ``machine``'s beside ``claims`` (the jobs that hold
    GPUs already); unchanged where it names a GPU, or the machine has none."""
    if not new.any_gpu or not machine.gpus:
        return new
    own = new.fixed.mps_pct or 0 if new.fixed is not None else 0

    def share(gpu: int) -> float:
        fixed = sum(c.fixed.mps_pct or 0 for c in claims if c.fixed and c.fixed.gpu == gpu)
        weight = sum(c.weight for c in claims if c.fixed is None and c.gpu == gpu)
        room = 100 - fixed - own
        return room if new.fixed is not None else room * new.weight / (weight + new.weight)

    best = max(machine.gpus, key=lambda g: (g.mps, share(g.index), -g.index)).index
    fixed = None if new.fixed is None else replace(new.fixed, gpu=best)
    return replace(new, gpu=best, any_gpu=False, fixed=fixed)
