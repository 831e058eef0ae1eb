"""An env the actors could not step is refused when it is probed, saying what it declared and
what is allowed, rather than crash-looping the actors or training on shifted actions."""

from __future__ import annotations

import sys
import textwrap

import pytest

from runtime.env_backends import resolve_backend
from runtime.envs import EnvError, probe_env

ENVS = """
import gymnasium as gym
import numpy as np
from gymnasium import spaces
from gymnasium.envs.classic_control import CartPoleEnv


class Shifted(CartPoleEnv):
    def __init__(self, **kw):
        super().__init__(**kw)
        self.action_space = spaces.Discrete(3, start=-1)


class Short(CartPoleEnv):
    def reset(self, **kw):
        obs, info = super().reset(**kw)
        return obs[:3], info


class Broken(gym.Env):
    def __init__(self):
        raise FileNotFoundError("assets/robot.xml")


gym.register("Shifted-v0", entry_point=Shifted)
gym.register("Short-v0", entry_point=Short)
gym.register("Broken-v0", entry_point=Broken)
"""


@pytest.fixture
def env_module(tmp_path, monkeypatch):
    (tmp_path / "checked_envs.py").write_text(textwrap.dedent(ENVS))
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "checked_envs"
    sys.modules.pop("checked_envs", None)


@pytest.mark.parametrize(
    "env, said",
    [
        ("Shifted-v0", "starts at -1; allowed: Discrete actions from 0"),
        ("Short-v0", "reset returned an observation of shape (3,)"),
        ("Broken-v0", "cannot make environment 'checked_envs:Broken-v0': FileNotFoundError"),
    ],
)
def test_an_env_the_actors_could_not_step_is_refused_when_probed(env_module, env, said):
    with pytest.raises(EnvError) as err:
        probe_env(f"{env_module}:{env}")
    assert said in " ".join(str(err.value).split())


def test_gymnasiums_own_mujoco_v3_ids_are_not_custom_and_run_on_envpool():
    envpool = pytest.importorskip("envpool")
    if "Ant-v3" not in envpool.list_all_envs():
        pytest.skip("this EnvPool has no Ant-v3")
    assert resolve_backend("Ant-v3", "envpool") == "envpool"
    assert resolve_backend("Ant-v3", "auto") == "envpool"
    assert probe_env("Ant-v3", "envpool").act_dim == 8


def test_an_env_an_env_module_registers_is_probed_every_run(env_module):
    from runtime.probe_cache import entry_path

    __import__(env_module)  # as --env-module imports it: its ids are plain ids now
    assert entry_path("Short-v0", "auto", 32, {}, ["cpu"]) is None  # its code may change
    assert entry_path("CartPole-v1", "auto", 32, {}, ["cpu"]) is not None
