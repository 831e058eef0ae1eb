"""Environment facts the runtime needs before any process starts, and the env factory actors use."""

from __future__ import annotations

import difflib
from dataclasses import dataclass

import gymnasium as gym
import numpy as np


class EnvError(ValueError):
    """An environment id that cannot be made, or spaces this runtime does not support."""


@dataclass(frozen=True)
class EnvInfo:
    """Spaces of one environment, flattened to what the policy sees."""

    env_id: str
    obs_dim: int
    discrete: bool
    act_dim: int
    """Number of actions (discrete) or action dimensions (continuous)."""
    act_low: tuple[float, ...] = ()
    act_high: tuple[float, ...] = ()


def make_env(env_id: str) -> gym.Env:
    """Creates one environment; unknown ids raise ``EnvError`` with close matches."""
    try:
        return gym.make(env_id)
    except gym.error.Error as exc:
        known = list(gym.registry)
        close = difflib.get_close_matches(env_id, known, n=3, cutoff=0.5)
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        why = str(exc).split(" Did you mean")[0] if close else str(exc)  # one hint, ours
        raise EnvError(f"cannot make environment {env_id!r}: {why}{hint}") from None
    except ImportError as exc:
        raise EnvError(
            f"environment {env_id!r} needs a package that is not installed ({exc}); "
            "MuJoCo envs need: pip install 'rl-autotune[mujoco]'"
        ) from None


def probe_env(env_id: str) -> EnvInfo:
    """Makes the environment once and describes its spaces.

    Raises:
        EnvError: Unknown id, or an observation/action space that is not Box / Discrete.
    """
    env = make_env(env_id)
    try:
        obs_space, act_space = env.observation_space, env.action_space
        if not isinstance(obs_space, gym.spaces.Box):
            raise EnvError(
                f"{env_id}: observation space {obs_space} is not supported; allowed: Box"
            )
        obs_dim = int(np.prod(obs_space.shape))
        if isinstance(act_space, gym.spaces.Discrete):
            return EnvInfo(env_id, obs_dim, True, int(act_space.n))
        if isinstance(act_space, gym.spaces.Box) and len(act_space.shape) == 1:
            return EnvInfo(
                env_id,
                obs_dim,
                False,
                int(act_space.shape[0]),
                tuple(float(x) for x in act_space.low),
                tuple(float(x) for x in act_space.high),
            )
        raise EnvError(
            f"{env_id}: action space {act_space} is not supported; allowed: Discrete, 1-D Box"
        )
    finally:
        env.close()
