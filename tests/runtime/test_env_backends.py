"""Env backends (``runtime.env_backends``): gymnasium and EnvPool give an actor the same episode
bookkeeping and seeding, bad backend choices are refused saying what is allowed, and a run on
EnvPool learns and can move to gymnasium mid-run without losing a step."""

from __future__ import annotations

import json
import subprocess
import sys

import gymnasium as gym
import numpy as np
import pytest

from runtime.config import ConfigError, TrainConfig
from runtime.env_backends import make_envs, resolve_backend
from runtime.envs import EnvError

pytest.importorskip("envpool")
BACKENDS = ("gymnasium", "envpool")


def _episodes(env_id: str, backend: str, k: int, steps: int, act) -> tuple[list, list]:
    """Steps ``k`` envs in two groups (as an actor with a remote policy does) and keeps the
    actor's bookkeeping: (return, length, terminated, truncated) per ended episode, and the
    observations handed back right after an episode ended (reset ones)."""
    envs = make_envs(env_id, backend, k, seed=3)
    obs = envs.reset()
    ret, length = np.zeros(k), np.zeros(k, int)
    ended, fresh = [], []
    for _ in range(steps):
        for lo, hi in ((0, k // 2), (k // 2, k)):
            out = envs.step(lo, hi, act(obs[lo:hi]))
            ret[lo:hi] += out.rewards
            length[lo:hi] += 1
            for j in np.flatnonzero(out.terminated | out.truncated):
                i = lo + int(j)
                assert int(j) in out.final_obs and out.final_obs[int(j)].shape == obs[i].shape
                ended.append((ret[i], length[i], bool(out.terminated[j]), bool(out.truncated[j])))
                fresh.append(out.obs[j].copy())
                ret[i], length[i] = 0.0, 0
            obs[lo:hi] = out.obs
    envs.close()
    return ended, fresh


@pytest.mark.parametrize("backend", BACKENDS)
def test_cartpole_episodes_end_terminated_with_a_fresh_reset_and_no_step_spent_on_it(backend):
    """CartPole pays 1 per step: an episode's return equals its length only if no reset step
    (EnvPool's own auto-reset gives reward 0) is taken or counted."""
    ended, fresh = _episodes("CartPole-v1", backend, 4, 400, lambda o: (o[:, 2] > 0).astype(int))
    assert len(ended) > 20
    assert all(r == n and term and not trunc for r, n, term, trunc in ended)
    assert all(np.abs(o).max() <= 0.05 for o in fresh)  # CartPole resets within +-0.05


def test_both_backends_time_out_pendulum_alike():
    """Pendulum never terminates: every episode is truncated at exactly 200 steps, and both
    backends end the same episodes at the same steps."""
    runs = [
        _episodes("Pendulum-v1", b, 4, 450, lambda o: np.zeros((len(o), 1), np.float32))
        for b in BACKENDS
    ]
    for ended, _ in runs:
        assert [(n, term, trunc) for _, n, term, trunc in ended] == [(200, False, True)] * 8
    returns = [np.array([r for r, *_ in ended]) for ended, _ in runs]
    assert all((r < 0).all() for r in returns)  # costs, summed as the env gave them


@pytest.mark.parametrize("backend", BACKENDS)
def test_env_i_of_an_actor_is_seeded_with_seed_plus_i(backend):
    three = make_envs("CartPole-v1", backend, 3, seed=10)
    again = make_envs("CartPole-v1", backend, 3, seed=10)
    second = make_envs("CartPole-v1", backend, 1, seed=11)
    first = three.reset()
    assert np.array_equal(first, again.reset())  # deterministic
    assert np.array_equal(first[1], second.reset()[0])
    assert not np.array_equal(first[0], first[1])
    for envs in (three, again, second):
        envs.close()


@pytest.mark.parametrize("backend", BACKENDS)
def test_any_run_seed_gives_each_actor_env_seeds_both_backends_take(backend):
    from runtime.actor import env_seed

    k = 16
    firsts = {env_seed(seed, a, r, k) for seed in (0, 3000, 2**40) for a in (0, 7) for r in (0, 1)}
    assert len(firsts) == 12 and all(0 <= s < 2**31 - k for s in firsts)  # int32, none < 0
    make_envs("CartPole-v1", backend, k, seed=env_seed(2**40, 3, 0, k)).reset()
    problems = " ".join(TrainConfig(env="CartPole-v1", seed=-1).problems())
    assert "seed=-1: must be an integer >= 0" in problems


def test_bad_backend_choices_are_refused_with_what_is_allowed():
    with pytest.raises(EnvError, match="close ids it has: Ant-v5"):
        resolve_backend("Ant-v6", "envpool")
    with pytest.raises(EnvError, match="custom gymnasium env, which runs on the gymnasium"):
        resolve_backend("my_envs:Maze-v0", "envpool")
    with pytest.raises(EnvError, match="allowed auto, gymnasium, envpool"):
        resolve_backend("CartPole-v1", "c++")
    assert resolve_backend("my_envs:Maze-v0", "auto") == "gymnasium"
    assert resolve_backend("CartPole-v1", "auto") == "envpool"
    assert resolve_backend("CartPole-v1", "gymnasium") == "gymnasium"
    problems = TrainConfig(env_backend="c++").problems()
    assert any("env_backend='c++': allowed ('auto', 'gymnasium', 'envpool')" in p for p in problems)
    with pytest.raises(ConfigError, match="EnvPool has no env 'Hopper-v9'; close ids it has"):
        TrainConfig(env="Hopper-v9", env_backend="envpool").validate()


@pytest.mark.slow
@pytest.mark.timeout(660)  # the run's own limit below, and the test's work around it
def test_cartpole_learns_on_envpool_from_the_cli(tmp_path):
    out = tmp_path / "r.json"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "autotune.cli",
            "train",
            "--env-backend",
            "envpool",
            *("--target-return", "400", "--steps", "600000"),  # ends once it learned to 400
            "--quiet",
            "--json",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    r = json.loads(out.read_text())
    assert r["config"]["env_backend"] == "envpool"
    assert r["target"]["reached"], r["target"]  # a 100-episode mean of at least 400
    assert r["target"]["return_then"] >= 400 and r["target"]["steps"] < 600_000
    assert r["sampled_steps"] == r["env_steps"] + r["discarded_steps"] + r["lost_steps"]
    assert r["lost_steps"] == 0


@pytest.mark.slow
def test_a_run_moves_from_envpool_to_gymnasium_mid_run_and_loses_nothing():
    from runtime.runner import Runner

    cfg = TrainConfig(  # the step count a cap: the run is stopped 9,000 steps after the change
        steps=2_000_000,
        actors=2,
        envs_per_actor=4,
        rollout_len=16,
        batch_size=512,
        env_backend="auto",
    )
    asked, at = [], []

    def drive(state):
        if not asked and state.trained_steps >= 3_000 and not state.draining:
            asked.append(runner.reconfigure(env_backend="gymnasium"))
            at.append(state.trained_steps)
        elif (
            asked and runner.cfg.env_backend == "gymnasium" and state.trained_steps > at[0] + 9_000
        ):
            runner.stop_requested = True  # trained on the new actors: drains as at the end

    runner = Runner(cfg, cfg.validate(), on_progress=drive)
    assert runner.cfg.env_backend == "envpool"  # auto, resolved where EnvPool has the env
    result = runner.run()
    assert asked and asked[0].respawn_actors
    assert [c["changed"] for c in result["changes"]] == [{"env_backend": "gymnasium"}]
    assert result["config"]["env_backend"] == "gymnasium"
    assert result["sampled_steps"] == result["env_steps"] + result["discarded_steps"]
    assert result["lost_steps"] == 0 and result["env_steps"] > at[0] + 9_000


class _ArrayRewardEnv(gym.Env):
    """A custom env whose reward and flags come as 1-element arrays (``w @ obs``)."""

    observation_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self, width: int = 1) -> None:
        self.width, self.t = width, 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.zeros(2, np.float32), {}

    def step(self, action):
        self.t += 1
        reward = np.full(self.width, 0.5)
        return np.zeros(2, np.float32), reward, np.array([self.t >= 3]), np.bool_(False), {}


def test_a_reward_or_flag_of_one_element_is_taken_as_its_element_and_more_is_refused():
    gym.register("ArrayReward-v0", entry_point=_ArrayRewardEnv)
    gym.register("WideReward-v0", entry_point=_ArrayRewardEnv, kwargs={"width": 2})
    envs = make_envs("ArrayReward-v0", "gymnasium", 2, seed=0)
    envs.reset()
    for t in range(3):
        out = envs.step(0, 2, np.zeros(2, np.int64))
        assert out.rewards.tolist() == [0.5, 0.5] and out.terminated.tolist() == [t == 2] * 2
    wide = make_envs("WideReward-v0", "gymnasium", 1, seed=0)
    wide.reset()
    with pytest.raises(EnvError, match="returned 2 values where one was expected"):
        wide.step(0, 1, np.zeros(1, np.int64))


def test_an_envpool_episode_that_terminates_on_its_last_allowed_step_is_terminated():
    """As gymnasium's time limit says it: terminated (and truncated) where the pole falls on
    the last step allowed, truncated only where it stands there; EnvPool alone calls both
    truncated, and the terminal state's value would be bootstrapped."""
    from runtime.env_backends import EnvPoolEnvs

    def episode(limit: int) -> tuple[int, bool, bool]:
        envs = EnvPoolEnvs("CartPole-v1", 1, seed=3, max_episode_steps=limit)
        envs.reset()
        for t in range(1, limit + 1):
            out = envs.step(0, 1, np.zeros(1, np.int64))  # always left: the pole falls soon
            if out.terminated[0] or out.truncated[0]:
                assert 0 in out.final_obs  # the last observation, kept before the reset
                envs.close()
                return t, bool(out.terminated[0]), bool(out.truncated[0])
        raise AssertionError("the episode did not end within its limit")

    falls, terminated, truncated = episode(500)
    assert terminated and not truncated and falls < 50
    assert episode(falls) == (falls, True, True)
    assert episode(falls - 1) == (falls - 1, False, True)
    assert EnvPoolEnvs("CartPole-v1", 2, seed=0).limit == 500  # the registered limit
