"""Reward normalisation in the actors, as gymnasium's ``NormalizeReward`` and CleanRL's
continuous PPO do it: each env keeps its discounted return (``G = gamma * G + r``, reset when
its episode ends), the actor keeps the running variance of those returns over its envs, and
each reward is divided by their standard deviation and clipped to ``+-CLIP``. The rewards sent
to the learner are the normalised ones; the episode returns reported stay the env's own.

Every actor keeps its own statistics, as a vectorised env does over its envs; a restarted
actor starts them afresh (variance 1, so its first rewards pass nearly unscaled).
"""

from __future__ import annotations

import numpy as np

CLIP = 10.0
EPSILON = 1e-8


class RewardNormalizer:
    """Divides rewards by the running standard deviation of their discounted returns.

    Args:
        n_envs: Envs of the actor (one discounted return each).
        gamma: The learner's discount factor.
    """

    def __init__(self, n_envs: int, gamma: float) -> None:
        self.gamma = gamma
        self.returns = np.zeros(n_envs, np.float64)
        self.mean, self.var, self.count = 0.0, 1.0, 1e-4

    def __call__(self, envs: slice, rewards: np.ndarray, dones: np.ndarray) -> np.ndarray:
        """The normalised rewards of one step of ``envs`` (``dones``: episodes that ended with
        that step, whose returns start again after it)."""
        g = self.returns[envs] * self.gamma + rewards
        self._update(g)
        self.returns[envs] = np.where(dones > 0, 0.0, g)
        scaled = rewards / np.sqrt(self.var + EPSILON)
        return np.clip(scaled, -CLIP, CLIP).astype(np.float32)

    def _update(self, x: np.ndarray) -> None:
        """Chan's parallel update of the running mean and variance with the batch ``x``."""
        n = x.size
        if n == 0:
            return
        b_mean, b_var = float(x.mean()), float(x.var())
        delta, total = b_mean - self.mean, self.count + n
        m2 = self.var * self.count + b_var * n + delta * delta * self.count * n / total
        self.mean, self.var, self.count = self.mean + delta * n / total, m2 / total, total

    @property
    def std(self) -> float:
        return float(np.sqrt(self.var + EPSILON))
