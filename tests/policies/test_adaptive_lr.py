"""The learner's KL divergence per update and the ``adaptive`` learning-rate schedule that
steers it (``policies.appo``, ``APPOConfig.adapt_lr_gain``)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from policies.actor_critic import ActorCritic
from policies.appo import APPOConfig, APPOLearner
from policies.appo_config import LR_GAIN_MAX, LR_GAIN_MIN
from tests.policies.test_policies import bandit_batch


def test_the_gain_steps_by_one_and_a_half_toward_the_kl_target_within_its_bounds():
    cfg = APPOConfig(lr_schedule="adaptive", kl_target=0.01)
    assert cfg.adapt_lr_gain(1.0, 0.05) == pytest.approx(1 / 1.5)  # past twice the target
    assert cfg.adapt_lr_gain(1.0, 0.001) == pytest.approx(1.5)  # under half of it
    assert cfg.adapt_lr_gain(1.0, 0.01) == 1.0 and cfg.adapt_lr_gain(1.0, 0.019) == 1.0
    assert cfg.adapt_lr_gain(1.0, math.nan) == pytest.approx(1 / 1.5)
    assert cfg.adapt_lr_gain(LR_GAIN_MIN, 1.0) == LR_GAIN_MIN
    assert cfg.adapt_lr_gain(LR_GAIN_MAX, 0.0) == LR_GAIN_MAX


def test_the_schedule_and_its_target_are_checked():
    assert APPOConfig(lr_schedule="adaptive").problems() == []
    for bad in (0.0, -0.01, math.inf, "0.01"):
        (problem,) = APPOConfig(lr_schedule="adaptive", kl_target=bad).problems()
        assert problem.startswith("learner.kl_target=") and "finite number > 0" in problem


def test_the_reported_kl_is_the_exact_divergence_of_the_update():
    """One state, two actions: the KL from the policy before an update to the one after it,
    computed here from the two distributions, is what the learner reports."""
    torch.manual_seed(0)
    np.random.seed(0)
    model = ActorCritic(2, 2, True, spec="auto", normalize_obs=False)
    learner = APPOLearner(model, APPOConfig(lr=3e-2, lr_schedule="constant"), torch.device("cpu"))
    x = torch.zeros(1, 2)
    with torch.no_grad():
        before = torch.log_softmax(model.pi(x), -1)
    stats = learner.update(bandit_batch(model, n=1024, t=4))
    with torch.no_grad():
        after = torch.log_softmax(model.pi(x), -1)
    exact = float((before.exp() * (before - after)).sum())
    assert exact > 1e-3  # the update moved the policy
    assert stats.kl == pytest.approx(exact, rel=1e-4)


def test_a_continuous_policys_kl_sums_its_action_dimensions():
    torch.manual_seed(0)
    model = ActorCritic(3, 2, False, spec="auto", normalize_obs=False)
    obs = torch.randn(5, 4, 3)
    with torch.no_grad():
        before = model.evaluate_dist(obs, torch.zeros(5, 4, 2))[3]
        model.log_std.add_(0.3)
        kl = model.kl_from(before, obs)
    # equal means, std ratio e^0.3 on each of 2 dims: KL = 2 (0.3 + (e^-0.6 - 1) / 2)
    assert kl.shape == (5, 4)
    assert torch.allclose(kl, torch.full((5, 4), 2 * (0.3 + (math.exp(-0.6) - 1) / 2)))


def _run(lr: float, updates: int) -> tuple[APPOLearner, list]:
    torch.manual_seed(0)
    np.random.seed(0)
    model = ActorCritic(2, 2, True, spec="auto", normalize_obs=False)
    cfg = APPOConfig(lr=lr, lr_schedule="adaptive", kl_target=0.01)
    learner = APPOLearner(model, cfg, torch.device("cpu"), total_steps=10**9)
    return learner, [learner.update(bandit_batch(model, n=64, t=4)) for _ in range(updates)]


def test_an_adaptive_learner_lowers_a_rate_that_moves_the_policy_too_far():
    learner, stats = _run(lr=0.5, updates=2)
    assert stats[0].lr == 0.5 and stats[0].kl > 0.02
    assert stats[1].lr == pytest.approx(0.5 / 1.5)
    assert learner.current_lr() == pytest.approx(0.5 * learner.lr_gain)


def test_an_adaptive_learner_raises_a_timid_rate_and_the_raise_carries_over_a_hand_over():
    learner, stats = _run(lr=1e-7, updates=3)
    assert all(s.kl < 0.005 for s in stats)
    assert [s.lr for s in stats] == pytest.approx([1e-7, 1.5e-7, 2.25e-7])
    state = learner.state()
    assert state["lr_gain"] == pytest.approx(1.5**3)
    model = ActorCritic(2, 2, True, spec="auto", normalize_obs=False)
    heir = APPOLearner(model, learner.config, torch.device("cpu"), total_steps=10**9)
    heir.load_state(state)
    assert heir.current_lr() == pytest.approx(1e-7 * 1.5**3)
    del state["lr_gain"]  # a state saved before the schedule existed
    heir.load_state(state)
    assert heir.lr_gain == 1.0
    for bad, kept in ((math.nan, 1.0), (math.inf, 1.0), (1e6, LR_GAIN_MAX), (0.0, LR_GAIN_MIN)):
        heir.load_state({**state, "lr_gain": bad})
        assert heir.lr_gain == kept
