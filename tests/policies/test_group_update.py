"""A trainer group takes the step one trainer takes on all its rows: advantages normalised over
the group's minibatch, gradients averaged by rows, observation statistics summed."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from policies.actor_critic import ActorCritic
from policies.appo import APPOLearner
from policies.appo_config import APPOConfig

ROWS = (6, 2)  # uneven: the case where per-trainer normalisation differs most


def _batch(seed: int, n: int, t: int = 8, dim: int = 4) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "obs": (rng.normal(size=(n, t + 1, dim)) * 2 + 1).astype(np.float32),
        "actions": rng.integers(0, 3, size=(n, t)).astype(np.int64),
        "rewards": rng.normal(size=(n, t)).astype(np.float32),
        "dones": (rng.random((n, t)) < 0.1).astype(np.uint8),
        "logp": (np.log(1 / 3) + 0.1 * rng.normal(size=(n, t))).astype(np.float32),
        "versions": np.zeros((n, t), np.int32),
    }


def _learner(group: bool) -> APPOLearner:
    torch.manual_seed(0)
    config = APPOConfig(epochs=1, minibatches=1, lr_schedule="constant")
    return APPOLearner(ActorCritic(4, 3, True, "auto"), config, torch.device("cpu"), group=group)


def _weights(learner: APPOLearner) -> torch.Tensor:
    return torch.cat([p.detach().flatten() for p in learner.model.parameters()])


def _rank(rank: int, init_file: str, out_dir: str) -> None:
    from runtime.gmi.group import TrainerGroup

    torch.set_num_threads(1)
    group = TrainerGroup(rank, [[0, 1]], init_file, cuda=False)
    try:
        learner = _learner(group=True)
        learner.update(_batch(rank, ROWS[rank]), group)
        torch.save(_weights(learner), Path(out_dir) / f"rank{rank}.pt")
    finally:
        group.close()


@pytest.mark.timeout(120)
@pytest.mark.skipif(not dist.is_available(), reason="torch.distributed is not available")
def test_two_trainers_of_6_and_2_rows_step_as_one_trainer_on_all_8(tmp_path: Path) -> None:
    mp.spawn(_rank, args=(str(tmp_path / "init"), str(tmp_path)), nprocs=2, join=True)
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=True) for r in range(2)]
    one = _learner(group=False)
    start = _weights(one)
    both = [_batch(r, ROWS[r]) for r in range(2)]
    one.update({k: np.concatenate([b[k] for b in both]) for k in both[0]})
    assert torch.equal(ranks[0], ranks[1])
    step, group_step = _weights(one) - start, ranks[0] - start
    assert float(step.norm()) > 1e-3
    torch.testing.assert_close(group_step, step, rtol=1e-4, atol=1e-6)
