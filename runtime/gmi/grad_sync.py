"""Gradient averaging across trainer GMIs (data-parallel replicas), several per GPU.

The trainer GMIs of a run are laid out as a list per GPU of their global ranks, e.g.
``[[0, 1, 2], [3, 4, 5]]``. Following GMI-DRL, Algorithm 1 and Table 2, the layout picks one of
three strategies, each averaging every gradient over all ranks:

* **MPR, multi-process reduction** (one GPU, or CPU only): one all-reduce over all ranks through
  the host (the intra backend, gloo by default), since NCCL cannot put two ranks on one GPU.
* **MRR, multi-ring reduction** (the same ``t`` GMIs on each of ``g`` GPUs, ``t <= g``): ring ``i``
  joins the GMIs with local index ``i`` on every GPU (one per GPU, so NCCL can serve it). Each
  ring all-reduces, leaving ``S_i`` (the sum over local index ``i``) on its members; a second
  all-reduce among the GMIs of one GPU adds ``S_0 + ... + S_{t-1}``, the sum over all ranks.
  With ``t == 1`` this is the plain NCCL all-reduce.
* **HAR, hierarchical reduction** (uneven counts, or ``t > g``): sum inside each GPU's group
  (intra backend), all-reduce the per-GPU sums among one leader per GPU (inter backend), then
  broadcast each leader's total to its GPU's group (intra backend).

Each strategy ends by dividing the sum by the world size. Every rank must pass the same list of
tensors (same count, order, shapes and dtypes): the tensors are flattened into one buffer per
dtype and the buffers' elements are matched by position.
"""

from __future__ import annotations

import datetime
import enum
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

logger = logging.getLogger(__name__)

Layout = tuple[tuple[int, ...], ...]


class SyncStrategy(str, enum.Enum):
    """How gradients are averaged across trainer GMIs (GMI-DRL, Table 2)."""

    MPR = "multi-process-reduction"
    MRR = "multi-ring-reduction"
    HAR = "hierarchical-reduction"


def _validate(layout: Sequence[Sequence[int]]) -> Layout:
    """Check that ``layout`` holds each rank ``0..n-1`` exactly once on non-empty GPUs.

    Returns:
        The layout as a tuple of tuples.

    Raises:
        ValueError: if the layout is empty, a GPU has no rank, a rank is not an int, or the ranks
            are not exactly ``0..n-1`` each once.
    """
    if len(layout) == 0:
        raise ValueError("layout is empty; it needs at least one GPU with one rank, e.g. [[0]]")
    seen: dict[int, int] = {}
    for gpu, ranks in enumerate(layout):
        if len(ranks) == 0:
            raise ValueError(
                f"GPU {gpu} of the layout has no rank; every listed GPU needs at least one "
                "trainer GMI (leave unused GPUs out)"
            )
        for rank in ranks:
            if isinstance(rank, bool) or not isinstance(rank, int):
                raise ValueError(f"rank {rank!r} on GPU {gpu} is not an int; ranks are ints")
            if rank in seen:
                raise ValueError(
                    f"rank {rank} appears twice (GPUs {seen[rank]} and {gpu}); each rank "
                    "0..n-1 must appear exactly once"
                )
            seen[rank] = gpu
    n = len(seen)
    if set(seen) != set(range(n)):
        missing = sorted(set(range(n)) - set(seen))
        extra = sorted(set(seen) - set(range(n)))
        raise ValueError(
            f"layout of {n} ranks is missing ranks {missing} and has out-of-range ranks {extra};"
            f" ranks must be exactly 0..{n - 1}, each once"
        )
    return tuple(tuple(ranks) for ranks in layout)


def choose_strategy(layout: Sequence[Sequence[int]]) -> SyncStrategy:
    """Pick the gradient-sync strategy for a layout (GMI-DRL, Algorithm 1).

    Args:
        layout: Per GPU, the global ranks of the trainer GMIs on it.

    Returns:
        MPR for one GPU (or CPU only); HAR when GPUs hold different numbers of GMIs or more
        GMIs per GPU than there are GPUs; MRR otherwise.

    Raises:
        ValueError: if the layout is invalid (see ``plan``).
    """
    checked = _validate(layout)
    if len(checked) <= 1:
        return SyncStrategy.MPR
    counts = {len(ranks) for ranks in checked}
    if len(counts) > 1:
        return SyncStrategy.HAR
    if counts.pop() > len(checked):
        return SyncStrategy.HAR
    return SyncStrategy.MRR


@dataclass(frozen=True)
class SyncPlan:
    """A layout of trainer GMIs with the strategy that averages their gradients.

    Attributes:
        strategy: How gradients are averaged.
        layout: Per GPU, the global ranks of the trainer GMIs on it.
    """

    strategy: SyncStrategy
    layout: Layout
    _where: dict[int, tuple[int, int]] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        layout = _validate(self.layout)
        if self.strategy is SyncStrategy.MRR and len({len(r) for r in layout}) > 1:
            raise ValueError("MRR needs the same number of GMIs on every GPU; use HAR instead")
        where = {rank: (gpu, i) for gpu, ranks in enumerate(layout) for i, rank in enumerate(ranks)}
        object.__setattr__(self, "layout", layout)
        object.__setattr__(self, "_where", where)

    @property
    def world_size(self) -> int:
        """The number of trainer GMIs (ranks)."""
        return len(self._where)

    def _locate(self, rank: int) -> tuple[int, int]:
        if rank not in self._where:
            raise ValueError(
                f"rank {rank} is not in the layout; ranks are 0..{self.world_size - 1}"
            )
        return self._where[rank]

    def gpu_of(self, rank: int) -> int:
        """The index in the layout of the GPU that ``rank`` runs on."""
        return self._locate(rank)[0]

    def local_index(self, rank: int) -> int:
        """The position of ``rank`` among the GMIs of its GPU."""
        return self._locate(rank)[1]

    def local_group(self, rank: int) -> tuple[int, ...]:
        """The ranks on the same GPU as ``rank`` (itself included)."""
        return self.layout[self.gpu_of(rank)]

    @property
    def leaders(self) -> tuple[int, ...]:
        """One leader per GPU: the GMI with local index 0 (the paper fixes any one index)."""
        return tuple(ranks[0] for ranks in self.layout)

    def is_leader(self, rank: int) -> bool:
        """Whether ``rank`` is the leader of its GPU."""
        return self.local_index(rank) == 0

    @property
    def rings(self) -> tuple[tuple[int, ...], ...]:
        """For each local index ``i``, the ranks with index ``i`` on every GPU that has one."""
        depth = max(len(ranks) for ranks in self.layout)
        return tuple(
            tuple(ranks[i] for ranks in self.layout if i < len(ranks)) for i in range(depth)
        )


def plan(layout: Sequence[Sequence[int]]) -> SyncPlan:
    """Validate ``layout`` and pair it with the strategy from ``choose_strategy``.

    Raises:
        ValueError: if the layout is empty, lists a GPU with no rank, or does not hold each rank
            ``0..n-1`` exactly once.
    """
    return SyncPlan(choose_strategy(layout), _validate(layout))


def _staging_device(backend: str, home: torch.device) -> torch.device:
    """The device a buffer must be on for a collective of ``backend``."""
    name = backend.lower()
    if name == "gloo":
        return torch.device("cpu")
    if name == "nccl":
        return home if home.type == "cuda" else torch.device("cuda", torch.cuda.current_device())
    return home


class GradientSync:
    """Averages gradients in place over all trainer GMIs, following a ``SyncPlan``.

    Build it on every rank, after the caller has run ``torch.distributed.init_process_group``
    with the plan's world size: the constructor creates the sub-groups the strategy needs, and
    every rank creates every group in the same order, including groups it is not a member of.
    """

    def __init__(
        self,
        sync_plan: SyncPlan,
        rank: int,
        intra_backend: str = "gloo",
        inter_backend: str = "nccl",
        timeout: datetime.timedelta | None = None,
    ) -> None:
        """Create the process sub-groups for ``sync_plan``.

        Args:
            sync_plan: The layout and strategy shared by all ranks.
            rank: This process's global rank (as given to ``init_process_group``).
            intra_backend: Backend among the GMIs of one GPU (the host path; gloo).
            inter_backend: Backend among GMIs on different GPUs (leaders, rings).
            timeout: Timeout of the new groups; the default process-group timeout if None.

        Raises:
            RuntimeError: if the default process group is not initialized.
            ValueError: if the world size or rank disagree with the plan.
        """
        if not dist.is_initialized():
            raise RuntimeError("call torch.distributed.init_process_group before GradientSync")
        if dist.get_world_size() != sync_plan.world_size:
            raise ValueError(
                f"the process group has {dist.get_world_size()} ranks but the plan "
                f"{sync_plan.layout} has {sync_plan.world_size}; they must match"
            )
        if rank != dist.get_rank():
            raise ValueError(f"rank {rank} differs from the process group's {dist.get_rank()}")
        self.plan = sync_plan
        self.rank = rank
        self.intra_backend = intra_backend
        self.inter_backend = inter_backend
        self._timeout = timeout
        self._world: dist.ProcessGroup | None = None
        self._local: dist.ProcessGroup | None = None
        self._leaders: dist.ProcessGroup | None = None
        self._ring: dist.ProcessGroup | None = None
        strategy = sync_plan.strategy
        if strategy is SyncStrategy.MPR:
            self._world = self._new_group(range(sync_plan.world_size), intra_backend)
        elif strategy is SyncStrategy.MRR:
            for ring in sync_plan.rings:
                group = self._new_group(ring, inter_backend)
                if rank in ring:
                    self._ring = group
        if strategy is not SyncStrategy.MPR:
            for ranks in sync_plan.layout:
                group = self._new_group(ranks, intra_backend)
                if rank in ranks:
                    self._local = group
        if strategy is SyncStrategy.HAR:
            self._leaders = self._new_group(sync_plan.leaders, inter_backend)
        logger.debug("rank %d: %s over %s", rank, strategy.value, sync_plan.layout)

    def _new_group(self, ranks: Sequence[int], backend: str) -> dist.ProcessGroup | None:
        """Create a group (all ranks call this); return it if this rank is a member."""
        ranks = list(ranks)
        if len(ranks) < 2:  # decided by the layout alone, so every rank skips the same groups
            return None
        group = dist.new_group(ranks=ranks, backend=backend, timeout=self._timeout)
        return group if self.rank in ranks else None

    @staticmethod
    def _all_reduce(
        buf: torch.Tensor, group: dist.ProcessGroup | None, backend: str
    ) -> torch.Tensor:
        if group is None:
            return buf
        work = buf.to(_staging_device(backend, buf.device))
        dist.all_reduce(work, op=dist.ReduceOp.SUM, group=group)
        return work

    def _reduce_sum(self, flat: torch.Tensor) -> torch.Tensor:
        """Sum ``flat`` over all ranks, following the plan's strategy."""
        strategy = self.plan.strategy
        if strategy is SyncStrategy.MPR:
            return self._all_reduce(flat, self._world, self.intra_backend)
        if strategy is SyncStrategy.MRR:
            ring_sum = self._all_reduce(flat, self._ring, self.inter_backend)
            return self._all_reduce(ring_sum, self._local, self.intra_backend)
        buf = self._all_reduce(flat, self._local, self.intra_backend)
        buf = self._all_reduce(buf, self._leaders, self.inter_backend)
        if self._local is not None:
            buf = buf.to(_staging_device(self.intra_backend, buf.device))
            leader = self.plan.local_group(self.rank)[0]
            dist.broadcast(buf, src=leader, group=self._local)
        return buf

    def all_reduce_(self, tensors: list[torch.Tensor]) -> None:
        """Replace each tensor, in place, by its mean over all ranks.

        Args:
            tensors: Dense floating-point tensors on one device. Every rank must pass the same
                count, order, shapes and dtypes; there is no ``None`` (use zeros instead).

        Raises:
            ValueError: if a tensor is sparse or not floating point.
        """
        for t in tensors:
            if t.layout is not torch.strided or not (t.is_floating_point() or t.is_complex()):
                raise ValueError(f"need dense floating-point tensors, got {t.dtype} {t.layout}")
        buckets: dict[torch.dtype, list[torch.Tensor]] = {}
        for t in tensors:  # first-seen dtype order, the same on every rank
            buckets.setdefault(t.dtype, []).append(t)
        for bucket in buckets.values():
            flat = _flatten_dense_tensors([t.detach() for t in bucket])
            total = self._reduce_sum(flat).to(flat.device)
            total.div_(self.plan.world_size)
            for t, mean in zip(bucket, _unflatten_dense_tensors(total, bucket), strict=True):
                t.detach().copy_(mean)

    def sync_model_grads(self, model: torch.nn.Module) -> None:
        """Average the gradients of ``model``'s trainable parameters over all ranks.

        A parameter whose ``grad`` is None gets a zero gradient first, so every rank contributes
        the same layout; after the call it holds the mean of the other ranks' gradients.
        """
        self.all_reduce_(model_grads(model))


def model_grads(model: torch.nn.Module) -> list[torch.Tensor]:
    """The gradients of ``model``'s trainable parameters, zeros where a ``grad`` is None (so
    every rank contributes the same layout to a collective)."""
    grads = []
    for p in model.parameters():
        if p.requires_grad:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            grads.append(p.grad)
    return grads
