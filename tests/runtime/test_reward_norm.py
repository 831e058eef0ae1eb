"""Reward normalisation in the actors: the same figures as gymnasium's ``NormalizeReward``, per
env returns reset where episodes end, clipping, and off unless asked for."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest

from policies.appo_config import APPOConfig
from runtime.reward_norm import CLIP, RewardNormalizer


class _Rewards(gym.Env):
    """Returns the given rewards in turn, never ending."""

    observation_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)
    action_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)

    def __init__(self, rewards: np.ndarray) -> None:
        self.rewards, self.t = rewards, 0

    def reset(self, *, seed=None, options=None):
        return np.zeros(1, np.float32), {}

    def step(self, action):
        r = float(self.rewards[self.t])
        self.t += 1
        return np.zeros(1, np.float32), r, False, False, {}


def test_one_env_gets_what_gymnasiums_normalize_reward_gives():
    rewards = np.random.default_rng(0).normal(0.5, 2.0, 500)
    wrapped = gym.wrappers.NormalizeReward(_Rewards(rewards), gamma=0.99)
    wrapped.reset()
    theirs = np.array([wrapped.step(np.zeros(1))[1] for _ in rewards])
    norm = RewardNormalizer(1, 0.99)
    ours = np.array([norm(slice(0, 1), np.array([r]), np.zeros(1))[0] for r in rewards])
    # and CleanRL's clip after it (the first reward, over a single return, is far out)
    np.testing.assert_allclose(ours, np.clip(theirs, -CLIP, CLIP), rtol=1e-5, atol=1e-6)
    assert abs(theirs[0]) > CLIP and abs(ours[0]) == CLIP
    assert norm.std > 2.0  # the returns' spread, not the rewards'


def test_returns_restart_where_episodes_end_and_rewards_are_clipped():
    norm = RewardNormalizer(2, 0.9)
    for _ in range(50):  # env 0's episodes end every step, env 1's never
        norm(slice(0, 2), np.array([1.0, 1.0]), np.array([1, 0]))
    assert norm.returns[0] == 0.0 and norm.returns[1] == pytest.approx(10.0, rel=0.01)
    big = norm(slice(0, 1), np.array([1e6]), np.array([0]))
    assert big[0] == CLIP and big.dtype == np.float32


def test_off_unless_asked_for_and_checked():
    assert not APPOConfig().normalize_reward
    assert "normalize_reward='yes'" in APPOConfig(normalize_reward="yes").problems()[0]
