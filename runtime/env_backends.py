"""Env backends: how an actor steps its environments.

* ``gymnasium``: one ``gymnasium.Env`` per environment, stepped one by one in Python.
* ``envpool``: one EnvPool instance of all the actor's environments, stepped in C++ by
  ``threads`` worker threads (the cores the actor's budget gives it), in EnvPool's
  synchronous mode: an actor owns about one core, and on one core a batch step in C++ is what
  pays (less Python per step), not overlapping the step with the policy's forward pass.
* ``auto``: EnvPool when it is installed, loads and has the id with Box observations (the
  gymnasium backend flattens the others: ``runtime.envs.flat_observations``), else gymnasium
  (an installed EnvPool that does not load is a warning, with its error). A custom env
  (``module:EnvId``, or an id the run's env modules register) always uses gymnasium. The ids
  are read once from EnvPool and kept in the cache folder for that EnvPool
  (``runtime.envpool_index``), which also lets an actor import only its env's family.

Both backends give an actor the same bookkeeping (``VecEnvs.step``): the observation to act on
next (already reset where an episode ended), the reward, terminated and truncated flags, and the
final observation of every episode that ended. EnvPool resets an env on the step after its
episode ended, ignoring that step's action and returning reward 0; ``EnvPoolEnvs`` resets those
envs at once instead (a reset of only them), so no step is spent or counted on a reset, as with
gymnasium. Env ``i`` of an actor is seeded with ``seed + i`` in both backends.
"""

from __future__ import annotations

import difflib
import functools
import logging
import os
from dataclasses import dataclass
from typing import Any

import numpy as np

from runtime.envpool_index import index
from runtime.envs import EnvError, envpool_make, make_env

logger = logging.getLogger(__name__)

BACKENDS = ("auto", "gymnasium", "envpool")
INSTALL_HINT = "pip install 'rl-autotune[envpool]'"


def envpool_ids() -> tuple[str, ...]:
    """The env ids the installed EnvPool has; empty when EnvPool is not installed or does not
    load (``envpool_problem`` says which)."""
    return tuple(index()[0])


def envpool_problem() -> str | None:
    """Why EnvPool cannot be used here, or None: ``not installed``, or the error of an
    installed EnvPool that does not load (a library of its own missing on this host, such as
    MuJoCo's ``libEGL.so.1``), which is logged once as a warning."""
    return index()[1]


def is_custom(env_id: str) -> bool:
    """Whether ``env_id`` names a custom env: ``module:EnvId``, or an id registered with
    gymnasium by something other than gymnasium itself (the run's env modules)."""
    if ":" in env_id:
        return True
    import gymnasium as gym

    from runtime.envs import import_env_modules, run_modules

    import_env_modules(run_modules())
    spec = gym.registry.get(env_id)
    entry = getattr(spec, "entry_point", None)
    # gymnasium's own: a "gymnasium.…" path, or one of its functions (its MuJoCo v2/v3 ids
    # point at one that says mujoco-py is gone; EnvPool has those envs)
    where = entry if isinstance(entry, str) else getattr(entry, "__module__", None) or ""
    return spec is not None and not where.startswith("gymnasium")


@functools.cache
def _envpool_make_problem(env_id: str) -> str | None:
    """Why EnvPool lists ``env_id`` but cannot run it here (a library it loads only then,
    such as Procgen's Qt; observations that are not a Box, which its actors do not flatten),
    or None."""
    import gymnasium as gym

    from runtime.envs import EnvError, envpool_make

    try:
        pool = envpool_make(env_id, num_envs=1)
    except EnvError as exc:
        return str(exc)
    space = pool.observation_space
    pool.close()
    if not isinstance(space, gym.spaces.Box):
        return f"EnvPool's {env_id} observes {space}, not a Box (gymnasium's is flattened)"
    return None


def resolve_backend(env_id: str, backend: str) -> str:
    """The backend an actor uses for ``env_id``: ``gymnasium`` or ``envpool``.

    Raises:
        EnvError: an unknown backend; ``envpool`` asked for where it is not installed, for a
            custom env, or for an id it does not have (naming the close ids it has).
    """
    if backend not in BACKENDS:
        raise EnvError(f"env backend {backend!r}: allowed {', '.join(BACKENDS)}")
    if backend == "gymnasium":
        return backend
    custom = is_custom(env_id)
    ids = envpool_ids()
    if backend == "auto":
        if custom or env_id not in ids:
            return "gymnasium"
        problem = _envpool_make_problem(env_id)
        if problem is not None:
            logger.warning("%s; actors use gymnasium", problem)
        return "gymnasium" if problem else "envpool"
    if custom:
        raise EnvError(
            f"env backend envpool: {env_id!r} is a custom gymnasium env, which runs on the "
            "gymnasium backend only; use --env-backend gymnasium or auto"
        )
    if not ids:
        problem = envpool_problem()
        if problem == "not installed":
            raise EnvError(f"env backend envpool: EnvPool is not installed ({INSTALL_HINT})")
        raise EnvError(f"env backend envpool: EnvPool is {problem}; use --env-backend gymnasium")
    if env_id not in ids:
        close = difflib.get_close_matches(env_id, ids, n=4, cutoff=0.6)
        hint = f"; close ids it has: {', '.join(close)}" if close else ""
        raise EnvError(
            f"env backend envpool: EnvPool has no env {env_id!r}{hint}; use --env-backend "
            "gymnasium or auto for it"
        )
    problem = _envpool_make_problem(env_id)
    if problem is not None:
        raise EnvError(f"env backend envpool: {problem}; use --env-backend gymnasium or auto")
    return "envpool"


@dataclass
class Stepped:
    """What one step of some of an actor's envs gave, row ``j`` for env ``lo + j``."""

    obs: np.ndarray
    """The observations to act on next (float32, flattened): reset where an episode ended."""
    rewards: np.ndarray
    terminated: np.ndarray
    truncated: np.ndarray
    final_obs: dict[int, np.ndarray]
    """The last observation of each episode that ended, by row."""


class VecEnvs:
    """An actor's ``k`` environments (see the module docstring)."""

    def __init__(self, env_id: str, k: int, seed: int) -> None:
        self.env_id, self.k, self.seed = env_id, k, seed

    def reset(self) -> np.ndarray:
        """Every env's first observation (env ``i`` seeded ``seed + i``), shape ``(k, obs)``."""
        raise NotImplementedError

    def step(self, lo: int, hi: int, actions: np.ndarray) -> Stepped:
        """Steps envs ``lo..hi-1`` with ``actions`` (one row each)."""
        raise NotImplementedError

    def action_space(self):
        """One env's action space (a gymnasium space)."""
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError


def _flat(obs) -> np.ndarray:
    return np.asarray(obs, np.float32).reshape(len(obs), -1)


class GymnasiumEnvs(VecEnvs):
    def __init__(self, env_id: str, k: int, seed: int) -> None:
        super().__init__(env_id, k, seed)
        self.envs = [make_env(env_id) for _ in range(k)]

    def reset(self) -> np.ndarray:
        first = []
        for i, env in enumerate(self.envs):
            first.append(env.reset(seed=self.seed + i)[0])
            env.action_space.seed(self.seed + i)
        return _flat(first)

    def step(self, lo: int, hi: int, actions: np.ndarray) -> Stepped:
        n = hi - lo
        obs, rewards = [None] * n, np.empty(n, np.float64)
        term, trunc = np.zeros(n, bool), np.zeros(n, bool)
        final = {}
        for j in range(n):
            env = self.envs[lo + j]
            o, r, te, tr, _ = env.step(actions[j])
            rewards[j], term[j], trunc[j] = _scalar(r), _scalar(te), _scalar(tr)
            if term[j] or trunc[j]:
                final[j] = np.asarray(o, np.float32).ravel()
                o, _ = env.reset()
            obs[j] = o
        return Stepped(_flat(obs), rewards, term, trunc, final)

    def action_space(self):
        return self.envs[0].action_space

    def close(self) -> None:
        for env in self.envs:
            env.close()


class EnvPoolEnvs(VecEnvs):
    """EnvPool's envs with gymnasium's time limit: EnvPool reports an episode that terminates
    on its last allowed step as truncated only (``terminated = done & ~trunc``), which would
    bootstrap a terminal state's value. So the pool is made with one step more than the env's
    limit (``max_episode_steps``: None is its registered one), and the limit is applied here,
    from its ``elapsed_step``: truncated at the limit, terminated kept where both."""

    def __init__(
        self, env_id: str, k: int, seed: int, threads: int = 1, max_episode_steps: int | None = None
    ) -> None:
        super().__init__(env_id, k, seed)
        self.threads = max(1, min(threads, k))
        if max_episode_steps is None:
            from runtime.envpool_index import registration

            max_episode_steps = registration(env_id).make_spec(env_id).config.max_episode_steps
        self.limit = int(max_episode_steps)
        self.pool = envpool_make(
            env_id,
            num_envs=k,
            batch_size=k,
            num_threads=self.threads,
            seed=seed,
            max_episode_steps=self.limit + 1,  # never reached: ended here first
        )
        self.ids = np.arange(k, dtype=np.int32)

    def reset(self) -> np.ndarray:
        obs, info = self.pool.reset()
        return _flat(obs[np.argsort(info["env_id"])])

    def step(self, lo: int, hi: int, actions: np.ndarray) -> Stepped:
        ids = self.ids[lo:hi]
        obs, rewards, term, trunc, info = self.pool.step(np.asarray(actions), ids)
        order = np.argsort(info["env_id"])  # rows in the order asked for
        obs, rewards = _flat(obs[order]), np.asarray(rewards, np.float64)[order]
        term = np.asarray(term, bool)[order]  # its own limit is never reached: a true ending
        trunc = np.asarray(info["elapsed_step"])[order] >= self.limit
        ended = np.flatnonzero(term | trunc)
        final = {}
        if len(ended):
            final = {int(j): obs[j].copy() for j in ended}
            first, rinfo = self.pool.reset(ids[ended])
            obs[ended] = _flat(first[np.argsort(rinfo["env_id"])])
        return Stepped(obs, rewards, term, trunc, final)

    def action_space(self):
        return self.pool.action_space

    def close(self) -> None:
        self.pool.close()


def _scalar(value: Any) -> Any:
    """A step's reward or flag as one number: a 1-element array (``w @ obs`` of a custom env)
    is taken as its element, as gymnasium takes it.

    Raises:
        EnvError: it holds more than one value.
    """
    arr = np.asarray(value)
    if arr.size != 1:
        raise EnvError(
            f"an env step returned {arr.size} values where one was expected: {arr!r:.80}"
        )
    return arr.reshape(()).item()


def actor_threads(actors: int) -> int:
    """EnvPool worker threads per actor: its share of the cores this process may run on (its
    budget's), at least one (the trainer and the stages share them, as ``actor_cores``)."""
    return max(1, len(os.sched_getaffinity(0)) // max(1, actors))


def make_envs(env_id: str, backend: str, k: int, seed: int, threads: int = 1) -> VecEnvs:
    """``k`` envs of ``env_id`` on ``backend`` (``auto`` resolved by ``resolve_backend``).

    Raises:
        EnvError: as ``resolve_backend`` and ``runtime.envs.make_env`` do.
    """
    if resolve_backend(env_id, backend) == "envpool":
        return EnvPoolEnvs(env_id, k, seed, threads)
    return GymnasiumEnvs(env_id, k, seed)
