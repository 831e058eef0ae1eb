"""A custom env for ``autotune train``: a module that registers its env with gymnasium.

From the directory that holds this file (no PYTHONPATH needed; the module is imported in every
process of the run, the actors' included):

    autotune train --env-module custom_env --env PointReach-v0 --steps 200000
    autotune train --env custom_env:PointReach-v0 --steps 200000     # the same, gymnasium's form

PointReach-v0: a point in the plane moves toward a target drawn at random each episode.
Observation: the point's and the target's positions (4 numbers); action: a velocity in
[-1, 1]^2, scaled by 0.05; reward: minus the distance to the target each step; 100 steps an
episode. A random policy scores about -110; one that heads straight for the target about -12.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np


class PointReach(gym.Env):
    def __init__(self) -> None:
        self.observation_space = gym.spaces.Box(-2.0, 2.0, (4,), np.float32)
        self.action_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
        self.pos = np.zeros(2, np.float32)
        self.goal = np.zeros(2, np.float32)
        self.t = 0

    def _obs(self) -> np.ndarray:
        return np.concatenate([self.pos, self.goal]).astype(np.float32)

    def reset(self, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        self.pos = self.np_random.uniform(-1, 1, 2).astype(np.float32)
        self.goal = self.np_random.uniform(-1, 1, 2).astype(np.float32)
        self.t = 0
        return self._obs(), {}

    def step(self, action):
        step = np.clip(np.asarray(action, np.float32), -1.0, 1.0) * 0.05
        self.pos = np.clip(self.pos + step, -2.0, 2.0)
        self.t += 1
        reward = -float(np.linalg.norm(self.pos - self.goal))
        return self._obs(), reward, False, self.t >= 100, {}


gym.register("PointReach-v0", entry_point=PointReach)
