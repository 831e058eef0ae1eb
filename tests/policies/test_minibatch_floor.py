"""A floor on the samples a minibatch holds: a smaller batch is split into fewer minibatches
(``APPOConfig.min_minibatch``), in the eager learner and the probe cache's key alike."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from policies.appo_config import APPOConfig
from runtime import probe_cache


def test_the_count_follows_the_batch_below_the_floor_and_never_above_what_was_asked():
    cfg = APPOConfig(minibatches=32, min_minibatch=512)
    assert [cfg.minibatches_for(b) for b in (65_536, 16_384, 8_192, 4_096, 1_000, 100)] == [
        32,
        32,
        16,
        8,
        1,
        1,
    ]
    assert APPOConfig(minibatches=32).minibatches_for(4_096) == 32  # 0: off, as asked
    # minibatches take whole trajectories: 9 of 100 steps make 4 of 2+ (not 7, some of 100)
    floor = APPOConfig(minibatches=32, min_minibatch=128)
    assert floor.minibatches_for(900, rows=9) == 4
    assert all(len(p) * 100 >= 128 for p in np.array_split(np.arange(9), 4))
    assert floor.minibatches_for(4_096, rows=128) == 32  # 32 trajectories of 32: 4 each
    # the result says what a batch of the run's size takes
    from runtime.config import TrainConfig
    from runtime.results import minibatch_doc

    cfg = TrainConfig(batch_size=4_096, learner=APPOConfig(minibatches=32, min_minibatch=512))
    assert minibatch_doc(cfg) == {"asked": 32, "min_samples": 512, "at_batch": 8}
    for bad in (-1, True, 2.5, "512"):
        (problem,) = APPOConfig(min_minibatch=bad).problems()
        assert problem.startswith("learner.min_minibatch=") and "integer >= 0" in problem


def test_the_learner_splits_a_small_batch_into_fewer_minibatches_and_says_so():
    from policies.actor_critic import ActorCritic
    from policies.appo import APPOLearner
    from runtime.envs import EnvInfo
    from runtime.learner_probe import synthetic_batch

    info = EnvInfo("synthetic", obs_dim=4, discrete=True, act_dim=2)

    def batch(samples: int) -> dict[str, np.ndarray]:
        return synthetic_batch(info, samples, rollout_len=32)

    cfg = APPOConfig(minibatches=8, min_minibatch=128, epochs=1)
    learner = APPOLearner(ActorCritic(4, 2, True, "auto:32:auto"), cfg, torch.device("cpu"))
    steps = []
    learner.optimizer.step = lambda *a, **k: steps.append(1)  # count the optimiser's steps
    assert learner.update(batch(512)).minibatches == 4  # 4 of 128, not 8 of 64
    assert len(steps) == 4
    assert learner.update(batch(2048)).minibatches == 8  # the 8 asked, of 256
    assert len(steps) == 12


@pytest.mark.parametrize("floor", [0, 512])
def test_the_probe_cache_key_changes_only_with_a_floor_set(floor: int):
    base = APPOConfig().to_dict()
    before = {k: v for k, v in base.items() if k != "min_minibatch"}  # an entry's older key
    now = {**base, "min_minibatch": floor}
    old_path = probe_cache.entry_path("CartPole-v1", "64", 32, before, ["cpu"])
    assert (probe_cache.entry_path("CartPole-v1", "64", 32, now, ["cpu"]) == old_path) is (
        floor == 0
    )
