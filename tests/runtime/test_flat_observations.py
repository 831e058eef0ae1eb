"""Observation spaces besides Box: Discrete, MultiDiscrete, MultiBinary, Tuple and Dict are
flattened to one vector (a Discrete as a one-hot) in every process; what cannot be flattened is
refused saying what is allowed."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import gymnasium as gym
import pytest

from runtime.envs import EnvError, probe_env

CUE_ENV = """
import gymnasium as gym
import numpy as np


class Cue(gym.Env):
    \"\"\"Each step shows a cue (one of 3) beside noise; acting on the cue pays 1.\"\"\"

    observation_space = gym.spaces.Dict(
        {"cue": gym.spaces.Discrete(3), "noise": gym.spaces.Box(-1, 1, (2,), np.float32)}
    )
    action_space = gym.spaces.Discrete(3)

    def _obs(self):
        self.cue = int(self.np_random.integers(3))
        return {"cue": self.cue, "noise": self.np_random.uniform(-1, 1, 2).astype(np.float32)}

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return self._obs(), {}

    def step(self, action):
        reward = float(action == self.cue)
        self.t += 1
        return self._obs(), reward, False, self.t >= 10, {}


gym.register("Cue-v0", entry_point=Cue)
"""


class _Texts(gym.Env):
    observation_space = gym.spaces.Text(8)
    action_space = gym.spaces.Discrete(2)

    def reset(self, seed=None, options=None):
        return "a", {}


def test_discrete_tuple_and_dict_observations_are_flattened_and_text_is_refused():
    assert probe_env("FrozenLake-v1").obs_dim == 16  # Discrete(16) as a one-hot
    assert probe_env("Blackjack-v1").obs_dim == 32 + 11 + 2  # a Tuple of three Discretes
    gym.register("FlatTexts-v0", entry_point=_Texts)
    try:
        with pytest.raises(EnvError) as refused:
            probe_env("FlatTexts-v0")
    finally:
        gym.registry.pop("FlatTexts-v0")
    said = str(refused.value)
    assert "observation space Text(" in said and "Tuple or Dict of these" in said, said


@pytest.mark.slow
def test_a_dict_observation_env_learns_through_the_actors(tmp_path):
    """The actors flatten it too: the policy learns to act on the one-hot cue (random: 3.3 of
    10 per episode)."""
    (tmp_path / "cue_envs.py").write_text(CUE_ENV)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "AUTOTUNE_ENV_MODULES")}
    flags = ["--env", "cue_envs:Cue-v0", "--actors", "1", "--envs-per-actor", "8"]
    flags += ["--batch-size", "1024", "--trainer-device", "cpu", "--trainers", "1"]
    flags += ["--steps", "30000", "--quiet", "--json", "r.json"]
    proc = subprocess.run(
        [sys.executable, "-m", "autotune.cli", "train", *flags],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    r = json.loads((tmp_path / "r.json").read_text())
    assert r["env_steps"] >= 30000 and r["lost_steps"] == 0
    assert r["return_mean"] >= 8.0, r["return_mean"]
