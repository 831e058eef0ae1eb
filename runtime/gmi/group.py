"""A trainer GMI's membership of its data-parallel group, and the lockstep it keeps.

All trainer GMIs of one generation form one ``torch.distributed`` group (gloo for the small
control sums; gradient sync per ``runtime.gmi.grad_sync``, NCCL between GPUs). Every update
is taken in lockstep: each GMI first says how many rows it will train (``agree``), then every
GMI runs the same number of gradient steps, each averaging the gradients weighted by the rows
behind them, so a GMI with fewer rows (or none, near the end of a run) still takes part and
the weights stay identical everywhere.
"""

from __future__ import annotations

import datetime
import logging

import torch
import torch.distributed as dist

from runtime.gmi.grad_sync import GradientSync, SyncPlan, SyncStrategy, model_grads, plan

logger = logging.getLogger(__name__)

GROUP_TIMEOUT = datetime.timedelta(minutes=10)
FORCED = {"mpr": SyncStrategy.MPR, "mrr": SyncStrategy.MRR, "har": SyncStrategy.HAR}


class TrainerGroup:
    """Rank ``rank`` of a group of trainer GMIs laid out as ``layout`` (see ``placement``).

    Args:
        rank: This GMI's global rank.
        layout: Per GPU, the ranks on it (one group on the CPU).
        init_file: A path in the run's private directory, unique to this generation of GMIs;
            every rank passes the same one (``torch.distributed`` file rendezvous).
        cuda: Whether the GMIs run on CUDA (then NCCL joins the GPUs).
        strategy: ``auto`` (Algorithm 1) or ``mpr`` / ``mrr`` / ``har`` to force one.
    """

    def __init__(
        self, rank: int, layout: list[list[int]], init_file: str, cuda: bool, strategy: str = "auto"
    ) -> None:
        self.plan: SyncPlan = (
            plan(layout) if strategy == "auto" else SyncPlan(FORCED[strategy], layout)
        )
        self.rank = rank
        self.world = self.plan.world_size
        dist.init_process_group(
            "gloo",
            init_method=f"file://{init_file}",
            rank=rank,
            world_size=self.world,
            timeout=GROUP_TIMEOUT,
        )
        inter = "nccl" if cuda and self.plan.strategy is not SyncStrategy.MPR else "gloo"
        self.sync = GradientSync(self.plan, rank, "gloo", inter, GROUP_TIMEOUT)
        logger.info(
            "GMI rank %d of %d: %s over %s",
            rank,
            self.world,
            self.plan.strategy.value,
            self.plan.layout,
        )

    @property
    def strategy(self) -> SyncStrategy:
        return self.plan.strategy

    def sum_(self, values: torch.Tensor) -> torch.Tensor:
        """Sums a small CPU tensor over all ranks, in place; returns it."""
        dist.all_reduce(values, op=dist.ReduceOp.SUM)
        return values

    def agree(self, rows: int, done: bool) -> tuple[int, bool]:
        """Every rank says how many rows it trains next and whether it has finished.

        Returns:
            (rows summed over all ranks, whether every rank has finished).
        """
        out = self.sum_(torch.tensor([float(rows), float(done)], dtype=torch.float64))
        return int(out[0].item()), int(out[1].item()) == self.world

    def average_grads_(self, model: torch.nn.Module, weight: float) -> float:
        """Replaces the gradients by their mean over ranks weighted by ``weight`` (rows).

        Returns:
            The summed weight; 0 means no rank had rows, and the step must be skipped by all.
        """
        grads = model_grads(model)
        w = torch.full((1,), float(weight), dtype=grads[0].dtype, device=grads[0].device)
        for g in grads:
            g.mul_(weight)
        self.sync.all_reduce_([*grads, w])  # means over ranks: sum(w g) / n and sum(w) / n
        total = float(w.item())
        if total > 0:
            for g in grads:
                g.div_(total)
        return total * self.world

    def close(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()
