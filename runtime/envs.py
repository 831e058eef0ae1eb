"""Environment facts the runtime needs before any process starts, and the env factory actors use.

Custom envs: a module that registers envs with gymnasium is imported in every process of a run
(the CLI's, the probes', the actors') before an env is made, from the directory the run was
started in. It is named in the env id (``module:EnvId``, gymnasium's own form) or given with
``TrainConfig.env_modules`` (``--env-module``); ``use_env_modules`` hands both to the run's
child processes through the environment (``AUTOTUNE_ENV_MODULES``, ``AUTOTUNE_ENV_PATH``).
"""

from __future__ import annotations

import difflib
import importlib
import os
import sys
import traceback
import warnings
from collections.abc import Sequence
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


ENV_MODULES = "AUTOTUNE_ENV_MODULES"
ENV_PATH = "AUTOTUNE_ENV_PATH"


def use_env_modules(modules: Sequence[str]) -> None:
    """Imports ``modules`` here and has every child process started from now on import them
    too (with this process's working directory on its path)."""
    os.environ.setdefault(ENV_PATH, os.getcwd())
    os.environ[ENV_MODULES] = ",".join(dict.fromkeys([*run_modules(), *modules]))
    import_env_modules(modules)


def run_modules() -> list[str]:
    """The env modules this run's processes import (``use_env_modules``)."""
    return [m for m in os.environ.get(ENV_MODULES, "").split(",") if m]


def import_env_modules(modules: Sequence[str]) -> None:
    """Imports each module (it registers its envs with gymnasium) with the run's directory on
    the path.

    Raises:
        EnvError: a module that fails to import, with its own error and where it was raised.
    """
    where = os.environ.get(ENV_PATH) or os.getcwd()
    if where not in sys.path:
        sys.path.insert(0, where)
    for name in modules:
        try:
            importlib.import_module(name)
        except Exception as exc:
            frames = traceback.extract_tb(exc.__traceback__)
            at = next((f for f in reversed(frames) if "importlib" not in f.filename), None)
            missing = isinstance(exc, ModuleNotFoundError) and exc.name == name
            place = f" ({at.filename}, line {at.lineno})" if at and not missing else ""
            raise EnvError(
                f"env module {name!r} (looked for in {where} and on the Python path) failed to "
                f"import: {type(exc).__name__}: {exc}{place}"
            ) from None


def make_env(env_id: str) -> gym.Env:
    """Creates one environment, after importing the run's env modules and the module an id of
    the form ``module:EnvId`` names; unknown ids raise ``EnvError`` with close matches."""
    module = [env_id.split(":", 1)[0]] if ":" in env_id else []
    import_env_modules(run_modules() + module)
    try:
        return flat_observations(gym.make(env_id))
    except gym.error.Error as exc:
        known = list(gym.registry)
        close = difflib.get_close_matches(env_id, known, n=3, cutoff=0.5)
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        why = str(exc).split(" Did you mean")[0] if close else str(exc)  # one hint, ours
        raise EnvError(f"cannot make environment {env_id!r}: {why}{hint}") from None
    except ImportError as exc:
        ours = "mujoco" in str(exc).lower()  # an extra of this package: say which
        hint = "; MuJoCo envs need: pip install 'rl-autotune[mujoco]'" if ours else ""
        raise EnvError(
            f"environment {env_id!r} needs a module that cannot be imported ({exc}){hint}"
        ) from None
    except Exception as exc:  # a custom env's constructor that fails
        why = " ".join(str(exc).split())[:300]
        raise EnvError(f"cannot make environment {env_id!r}: {type(exc).__name__}: {why}") from None


FLATTENED = (
    gym.spaces.Discrete,
    gym.spaces.MultiDiscrete,
    gym.spaces.MultiBinary,
    gym.spaces.Tuple,
    gym.spaces.Dict,
)
"""Observation spaces an env may have besides Box: the policy sees them flattened to one
vector (``gymnasium.wrappers.FlattenObservation``: a Discrete as a one-hot, a Tuple or Dict as
its parts side by side, Dict keys in sorted order)."""


def flat_observations(env: gym.Env) -> gym.Env:
    """``env`` with a Discrete, MultiDiscrete, MultiBinary, Tuple or Dict observation space
    flattened to a Box; any other env as it is (``probe_env`` refuses what cannot be)."""
    space = env.observation_space
    if not isinstance(space, FLATTENED) or not _flattenable(space):
        return env
    from gymnasium.wrappers import FlattenObservation

    return FlattenObservation(env)


def _flattenable(space: gym.spaces.Space) -> bool:
    """Whether every part of ``space`` is a Box or a space ``FLATTENED`` names."""
    if isinstance(space, gym.spaces.Tuple):
        return all(_flattenable(s) for s in space.spaces)
    if isinstance(space, gym.spaces.Dict):
        return all(_flattenable(s) for s in space.spaces.values())
    return isinstance(space, (gym.spaces.Box, *FLATTENED))


def envpool_make(env_id: str, **kwargs) -> object:
    """``envpool.make(env_id, env_type="gymnasium", **kwargs)``, without gymnasium's warning
    that EnvPool's float64 space bounds were cast to float32 (every make, every process)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*precision lowered.*")
        try:
            from runtime.envpool_index import registration  # the ids may be kept: may not load

            pool = registration(env_id).make(env_id, env_type="gymnasium", **kwargs)
            _ = pool.observation_space, pool.action_space  # built once, on first use
        except Exception as exc:  # a library it loads only now, a bad argument
            why = " ".join(str(exc).split())[:300]
            raise EnvError(f"EnvPool cannot make {env_id!r}: {type(exc).__name__}: {why}") from None
    return pool


def probe_env(env_id: str, backend: str = "gymnasium") -> EnvInfo:
    """Makes the environment once and describes its spaces (on ``backend``: ``gymnasium`` or
    ``envpool``, as ``runtime.env_backends.resolve_backend`` resolved it).

    Raises:
        EnvError: Unknown id, an observation space that cannot be flattened to a Box
            (``flat_observations``), or an action space that is not Discrete or a 1-D Box.
    """
    env = envpool_make(env_id, num_envs=1) if backend == "envpool" else make_env(env_id)
    try:
        obs_space, act_space = env.observation_space, env.action_space
        if not isinstance(obs_space, gym.spaces.Box):
            raise EnvError(
                f"{env_id}: observation space {obs_space} is not supported; allowed: Box, and "
                "Discrete, MultiDiscrete, MultiBinary, or a Tuple or Dict of these and Boxes "
                "(flattened to one vector)"
            )
        obs_dim = int(np.prod(obs_space.shape))
        if backend != "envpool":  # what it returns must be what it declares
            try:
                got = np.asarray(env.reset(seed=0)[0])
            except Exception as exc:
                raise EnvError(f"{env_id}: reset failed: {type(exc).__name__}: {exc}") from None
            if got.size != obs_dim or not np.issubdtype(got.dtype, np.number):
                raise EnvError(
                    f"{env_id}: reset returned an observation of shape {got.shape} ({got.dtype}) "
                    f"where its observation space {obs_space} declares {obs_dim} numbers"
                )
        if isinstance(act_space, gym.spaces.Discrete):
            if int(act_space.start) != 0:
                raise EnvError(
                    f"{env_id}: action space {act_space} starts at {int(act_space.start)}; "
                    "allowed: Discrete actions from 0 (gymnasium's default start)"
                )
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
