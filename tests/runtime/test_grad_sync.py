"""Gradient sync across trainer GMIs: Algorithm 1's choice, and real multi-process averaging."""

from __future__ import annotations

import datetime
import os
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

from runtime.gmi.grad_sync import GradientSync, SyncPlan, SyncStrategy, choose_strategy, plan

MPR, MRR, HAR = SyncStrategy.MPR, SyncStrategy.MRR, SyncStrategy.HAR
STEPS = 3
LR = 0.1


@pytest.mark.parametrize(
    ("layout", "expected"),
    [
        ([[0]], MPR),
        ([[0, 1, 2, 3]], MPR),
        ([[0], [1]], MRR),
        ([[0, 1], [2, 3]], MRR),  # 2 per GPU <= 2 GPUs: two rings
        ([[0, 1, 2], [3, 4, 5]], HAR),  # 3 per GPU > 2 GPUs
        ([[0, 1], [2]], HAR),  # uneven
        ([[0], [1], [2], [3]], MRR),
        ([[0, 2], [1, 3], [4, 5]], MRR),  # ranks need not be contiguous per GPU
    ],
)
def test_choose_strategy(layout: list[list[int]], expected: SyncStrategy) -> None:
    assert choose_strategy(layout) is expected
    assert plan(layout).strategy is expected


@pytest.mark.parametrize(
    ("layout", "message"),
    [
        ([[0, 1], [1]], "appears twice"),
        ([[0, 2]], "missing ranks \\[1\\]"),
        ([[1]], "missing ranks \\[0\\]"),
        ([[0], []], "GPU 1 of the layout has no rank"),
        ([], "layout is empty"),
        ([[0, "1"]], "is not an int"),
    ],
)
def test_invalid_layouts(layout: list, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        choose_strategy(layout)
    with pytest.raises(ValueError, match=message):
        plan(layout)


def test_plan_queries() -> None:
    p = plan([[0, 1, 2], [3, 4]])
    assert p.strategy is HAR and p.world_size == 5
    assert p.layout == ((0, 1, 2), (3, 4))
    assert [p.gpu_of(r) for r in range(5)] == [0, 0, 0, 1, 1]
    assert p.local_group(4) == (3, 4) and p.local_index(4) == 1
    assert p.leaders == (0, 3)
    assert [p.is_leader(r) for r in range(5)] == [True, False, False, True, False]
    assert p.rings == ((0, 3), (1, 4), (2,))
    with pytest.raises(ValueError, match="not in the layout"):
        p.gpu_of(5)
    with pytest.raises(ValueError, match="MRR needs the same number"):
        SyncPlan(MRR, ((0, 1), (2,)))


class _Net(nn.Module):
    """A small MLP plus a bias that only even ranks use (its grad stays None on odd ranks)."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(4, 16), nn.Tanh(), nn.Linear(16, 2))
        self.even_bias = nn.Parameter(torch.zeros(2))

    def forward(self, x: torch.Tensor, rank: int) -> torch.Tensor:
        y = self.body(x)
        return y + self.even_bias if rank % 2 == 0 else y


def _batch(rank: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(8, 4, generator=gen), torch.randn(8, 2, generator=gen)


def _local_grads(model: _Net, rank: int, step: int) -> None:
    model.zero_grad(set_to_none=True)
    x, y = _batch(rank, step)
    nn.functional.mse_loss(model(x, rank), y).backward()


def _sgd(model: nn.Module) -> None:
    with torch.no_grad():
        for p in model.parameters():
            p -= LR * p.grad


def _worker(rank: int, layout: list[list[int]], init_file: str, out_dir: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo",
        init_method=f"file://{init_file}",
        rank=rank,
        world_size=sum(len(g) for g in layout),
        timeout=datetime.timedelta(seconds=60),
    )
    try:
        sync = GradientSync(plan(layout), rank, intra_backend="gloo", inter_backend="gloo")
        torch.manual_seed(0)
        model = _Net()
        for step in range(STEPS):
            _local_grads(model, rank, step)
            sync.sync_model_grads(model)
            _sgd(model)
        # Two dtypes in one call: one flat buffer per dtype, each averaged on its own.
        mixed = [torch.full((3,), float(rank), dtype=torch.float64), torch.full((2, 2), 2.0 * rank)]
        sync.all_reduce_(mixed)
        torch.save(model.state_dict(), os.path.join(out_dir, f"rank{rank}.pt"))
        torch.save(mixed, os.path.join(out_dir, f"mixed{rank}.pt"))
    finally:
        dist.destroy_process_group()


def _reference(world_size: int) -> dict[str, torch.Tensor]:
    """What one process gets by averaging every rank's gradients itself."""
    torch.manual_seed(0)
    model = _Net()
    for step in range(STEPS):
        total = [torch.zeros_like(p) for p in model.parameters()]
        for rank in range(world_size):
            _local_grads(model, rank, step)
            for acc, p in zip(total, model.parameters(), strict=True):
                if p.grad is not None:
                    acc += p.grad
        for p, acc in zip(model.parameters(), total, strict=True):
            p.grad = acc / world_size
        _sgd(model)
    return model.state_dict()


@pytest.mark.timeout(120)
@pytest.mark.skipif(not dist.is_available(), reason="torch.distributed is not available")
@pytest.mark.parametrize(
    ("layout", "strategy"),
    [([[0, 1, 2]], MPR), ([[0, 1], [2, 3]], MRR), ([[0, 1], [2]], HAR)],
)
def test_processes_agree_with_reference(
    layout: list[list[int]], strategy: SyncStrategy, tmp_path: Path
) -> None:
    assert choose_strategy(layout) is strategy
    world_size = sum(len(g) for g in layout)
    mp.spawn(
        _worker,
        args=(layout, str(tmp_path / "init"), str(tmp_path)),
        nprocs=world_size,
        join=True,
    )
    states = [torch.load(tmp_path / f"rank{r}.pt") for r in range(world_size)]
    expected = _reference(world_size)
    torch.manual_seed(0)
    untouched = _Net().state_dict()
    for name, want in expected.items():
        assert not torch.equal(want, untouched[name]), f"{name} never moved"
        for rank, state in enumerate(states):
            assert torch.equal(state[name], states[0][name]), f"rank {rank} drifted on {name}"
            torch.testing.assert_close(state[name], want, rtol=1e-5, atol=1e-6)
    mean_rank = (world_size - 1) / 2
    for rank in range(world_size):
        f64, f32 = torch.load(tmp_path / f"mixed{rank}.pt")
        assert f64.dtype == torch.float64 and f32.dtype == torch.float32
        torch.testing.assert_close(f64, torch.full((3,), mean_rank, dtype=torch.float64))
        torch.testing.assert_close(f32, torch.full((2, 2), 2.0 * mean_rank))


def test_single_rank_world_and_errors(tmp_path: Path) -> None:
    """In one process: a world of one is a no-op mean; mismatches and bad tensors are refused."""
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'init'}", rank=0, world_size=1)
    try:
        sync = GradientSync(plan([[0]]), 0, inter_backend="gloo")
        grads = [
            torch.arange(6, dtype=torch.float32).reshape(2, 3),
            torch.ones(2, dtype=torch.float64),
        ]
        before = [g.clone() for g in grads]
        sync.all_reduce_(grads)
        for g, b in zip(grads, before, strict=True):
            assert torch.equal(g, b)
        with pytest.raises(ValueError, match="floating-point"):
            sync.all_reduce_([torch.ones(3, dtype=torch.int64)])
        with pytest.raises(ValueError, match="has 2"):
            GradientSync(plan([[0], [1]]), 0)
        with pytest.raises(ValueError, match="differs"):
            GradientSync(plan([[0]]), 1)
    finally:
        dist.destroy_process_group()
    with pytest.raises(RuntimeError, match="init_process_group"):
        GradientSync(plan([[0]]), 0)
