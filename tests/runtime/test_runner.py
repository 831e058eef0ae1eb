"""Whole runs as real processes: nothing is lost, killed actors restart, Ctrl-C drains."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from conftest import wait_until

from autotune.workflows.progress_log import latest_steps
from runtime.config import TrainConfig
from runtime.runner import Runner

pytestmark = pytest.mark.slow


def assert_nothing_lost(result: dict) -> None:
    assert result["sampled_steps"] == (
        result["env_steps"] + result["discarded_steps"] + result["lost_steps"]
    ), result


def small_config(**over) -> TrainConfig:
    base = {"steps": 6_000, "actors": 2, "envs_per_actor": 4, "rollout_len": 16, "batch_size": 512}
    return TrainConfig(**{**base, **over})


def test_clean_run_loses_nothing_and_every_stage_moves_data():
    cfg = small_config()
    result = Runner(cfg, cfg.validate()).run()
    assert_nothing_lost(result)
    assert result["lost_steps"] == result["actor_restarts"] == 0
    assert result["env_steps"] >= cfg.steps
    stages = result["stages"]  # each moved data; the compressor concatenates (fewer messages)
    assert all(s["messages"] > 0 and s["bytes"] > 0 for s in stages.values()), stages
    assert stages["compressor"]["messages"] < stages["dispenser"]["messages"]
    assert stages["compressor"]["bytes"] == stages["dispenser"]["bytes"]
    # where the actors' time went: stepping, acting, and their CPU per env step
    spent, sampled = result["actor_time"], result["sampled_steps"]
    assert spent["env_s"] > 0 and spent["policy_s"] > 0 and spent["cpu_s"] > 0
    assert spent["cpu_us_per_step"] == pytest.approx(1e6 * spent["cpu_s"] / sampled, rel=1e-3)
    assert result["minibatches"] == {"asked": 4, "min_samples": 0, "at_batch": 4}
    cpu = result["cpu_time"]  # where the CPU went: each kind of process reported its seconds
    assert all(cpu[k] > 0 for k in ("compressor", "migrator", "trainers", "runner")), cpu
    assert cpu["actors"] == spent["cpu_s"]
    assert cpu["core_s"] == pytest.approx(cpu["cores"] * result["wall_s"], abs=0.1)
    # the timeline keeps the actors' waits on their in-flight budget, so a window can read them
    timeline = result["timeline"]
    assert timeline["columns"][-1] == "actor_throttle_s"
    waits = [row[4] for row in timeline["rows"]]
    assert waits == sorted(waits) and waits[-1] <= result["actor_waits"]["throttle_s"] + 1e-6


def test_stale_experience_is_discarded_and_counted():
    cfg = small_config(learner=TrainConfig().learner.__class__(max_policy_lag=1))
    cfg = TrainConfig(**{**cfg.__dict__, "max_inflight_batches": 4.0})
    result = Runner(cfg, cfg.validate()).run()
    assert_nothing_lost(result)
    assert result["discarded_steps"] > 0


def test_an_actor_killed_mid_run_is_restarted_and_its_lost_steps_counted():
    """The run goes on until the restarted actor has stepped (the step count is only a cap),
    so a loaded machine, on which the other actor could reach a fixed count before the
    restart is due, only makes it slower."""
    cfg = small_config(steps=10_000_000)
    killed = []
    runner: Runner

    def kill_once_then_stop(state):
        if not killed and state.trained_steps >= 3_000:
            pid = runner.slots[0].process.pid
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)
        elif killed and runner.restarts and not runner.stop_requested:
            again = [s for s in runner.slots if s.index == 0 and s.process.pid != killed[0]]
            if again and again[0].stepped.value > 0:
                runner.stop_requested = True  # drains as at the end

    runner = Runner(cfg, cfg.validate(), on_progress=kill_once_then_stop)
    result = runner.run()
    assert killed and result["actor_restarts"] == 1
    assert_nothing_lost(result)
    # at most the rollout it was collecting plus what it had queued but not delivered
    assert (
        0
        <= result["lost_steps"]
        <= cfg.inflight_steps_per_actor() + cfg.envs_per_actor * (cfg.rollout_len)
    )


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])  # Ctrl-C; a scheduler's stop
def test_ctrl_c_drains_in_flight_experience_and_writes_the_result(tmp_path, sig):
    out, progress = tmp_path / "r.json", tmp_path / "p.jsonl"
    proc = subprocess.Popen(
        [
            *[sys.executable, "-m", "autotune.cli", "train", "--steps", "10000000"],
            *["--quiet", "--json", str(out), "--progress", str(progress)],
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    wait_until(lambda: latest_steps(progress) >= 2_000, proc, what="2,000 trained steps")
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    result = json.loads(out.read_text())
    assert result["interrupted"] is True and result["env_steps"] > 0
    assert_nothing_lost(result)
    assert result["lost_steps"] == 0


def test_ctrl_c_while_the_children_start_drains_the_run(tmp_path):
    """A terminal's Ctrl-C reaches the whole process group, children that are still starting
    (importing their modules) included: the run drains as at any other time, none of them dies
    of it."""
    import psutil

    out = tmp_path / "r.json"
    proc = subprocess.Popen(
        [
            *[sys.executable, "-m", "autotune.cli", "train", "--steps", "10000000", "--quiet"],
            *["--actors", "2", "--envs-per-actor", "4", "--batch-size", "1024"],
            *["--trainer-device", "cpu", "--trainers", "1", "--json", str(out)],
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own process group, as a terminal's job is
    )
    wait_until(lambda: psutil.Process(proc.pid).children(), proc, what="its first child")
    os.killpg(proc.pid, signal.SIGINT)
    _, err = proc.communicate(timeout=180)
    assert proc.returncode == 0, err[-2000:]
    result = json.loads(out.read_text())
    assert result["interrupted"] is True and not result.get("failure"), result.get("failure")
    assert_nothing_lost(result)


def _cmdline(proc) -> str:
    import psutil

    try:
        return " ".join(proc.cmdline()).strip()
    except (psutil.ZombieProcess, psutil.NoSuchProcess):  # a child that ended meanwhile
        return ""


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_no_child_outlives_a_runner_that_is_terminated_or_killed(sig):
    import psutil

    proc = subprocess.Popen(
        [
            *[sys.executable, "-m", "autotune.cli", "train", "--steps", "10000000", "--quiet"],
            *["--actors", "2", "--envs-per-actor", "4", "--batch-size", "1024"],
            *["--trainer-device", "cpu", "--trainers", "1"],
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 300  # a bound on a loaded machine; it ends at the fifth
    children: list = []
    while time.monotonic() < deadline and len(children) < 5:  # 3 services + 2 actors
        time.sleep(0.5)
        # the run's processes, by the titles they set once started (``ps`` shows the role);
        # multiprocessing's resource tracker is a child too
        children = [
            c
            for c in psutil.Process(proc.pid).children(recursive=True)
            if _cmdline(c).startswith("autotune: ")
        ]
    if len(children) < 5:  # do not leave a 10M-step job running behind a failed test
        for p in [*psutil.Process(proc.pid).children(recursive=True), proc]:
            p.kill()
    assert len(children) >= 5
    titles = {_cmdline(c) for c in children}
    assert {"autotune: compressor", "autotune: migrator", "autotune: actor 0"} <= titles, titles
    assert "autotune: actor 1" in titles and any(t.startswith("autotune: trainer") for t in titles)
    proc.send_signal(sig)
    proc.wait(timeout=120)
    _, alive = psutil.wait_procs(children, timeout=60)
    assert not alive, [c.pid for c in alive]
    # its private directory: removed by the run itself, or, after a SIGKILL, by the next run
    from runtime import run_dirs

    def its_dirs() -> list[str]:
        out = []
        for d in Path(tempfile.gettempdir()).glob(run_dirs.PREFIX + "*"):
            with contextlib.suppress(OSError, ValueError):
                if json.loads((d / run_dirs.OWNER).read_text())["pid"] == proc.pid:
                    out.append(str(d))
        return out

    left = its_dirs()
    assert (len(left) == 1) if sig == signal.SIGKILL else not left
    run_dirs.sweep()
    assert not its_dirs()


FAILING_ENV = """
import gymnasium as gym
from gymnasium.envs.classic_control import CartPoleEnv


class FailingStep(CartPoleEnv):
    def step(self, action):
        raise RuntimeError("this env fails at every step")


gym.register("FailingStep-v0", entry_point=FailingStep)
"""


def test_an_env_that_fails_at_every_step_stops_the_run_with_a_reason(tmp_path, monkeypatch):
    """No endless restart loop: each restart of the slot waits longer, and the fifth death
    within a minute ends the run, drained, with a result that says why."""
    (tmp_path / "failing_env.py").write_text(FAILING_ENV)
    monkeypatch.syspath_prepend(str(tmp_path))  # the spawned actors get this path too
    cfg = small_config(env="failing_env:FailingStep-v0", actors=1, steps=1_000_000)
    started = time.monotonic()
    result = Runner(cfg, cfg.validate()).run()
    assert "actor 0 died 5 times within 60 s" in result["failure"]
    assert "not restarted again" in result["failure"]
    assert result["actor_restarts"] == 4 and result["env_steps"] == 0
    assert_nothing_lost(result)
    # the back-off: 0.5 + 1 + 2 + 4 s between the five starts
    assert time.monotonic() - started >= 7.5


NAN_ENV = '''
import gymnasium as gym
import numpy as np
from gymnasium.envs.classic_control import CartPoleEnv


class NaNAfter(CartPoleEnv):
    """CartPole whose observations turn NaN after 300 steps of one env."""

    count = 0

    def step(self, action):
        obs, r, term, trunc, info = super().step(action)
        NaNAfter.count += 1
        if NaNAfter.count > 300:
            obs = np.full_like(obs, np.nan)
        return obs, r, term, trunc, info


gym.register("NaNAfter-v0", entry_point=NaNAfter)


class NaNAtTimeLimit(CartPoleEnv):
    """CartPole cut by a time limit of 20 steps, whose final observation is NaN: only the
    bootstrap from it would carry the NaN to the learner (the reset observation is fine)."""

    def reset(self, **kw):
        self.t = 0
        return super().reset(**kw)

    def step(self, action):
        obs, r, term, trunc, info = super().step(action)
        self.t += 1
        if self.t >= 20 and not term:
            return np.full_like(obs, np.nan), r, False, True, info
        return obs, r, term, trunc, info


gym.register("NaNAtTimeLimit-v0", entry_point=NaNAtTimeLimit)
'''


@pytest.mark.parametrize(
    "env, said",
    [
        ("NaNAfter-v0", "non-finite observation"),
        ("NaNAtTimeLimit-v0", "non-finite final observation of an episode cut by its time limit"),
    ],
)
def test_a_nan_observation_stops_the_run_naming_the_env_actor_and_step(
    tmp_path, monkeypatch, env, said
):
    (tmp_path / "nan_env.py").write_text(NAN_ENV)
    monkeypatch.syspath_prepend(str(tmp_path))
    ck = tmp_path / "ck"
    cfg = small_config(env=f"nan_env:{env}", steps=1_000_000, checkpoint=str(ck))
    result = Runner(cfg, cfg.validate()).run()
    failure = result["failure"]
    assert f"env nan_env:{env}, actor " in failure and said in failure, failure
    assert result["actor_restarts"] == 0  # not a crash to retry
    assert_nothing_lost(result)
    if (ck / "learner.pt").exists():  # whatever was saved holds no NaN
        import torch

        from runtime.checkpoint import load_state

        state = load_state(str(ck / "learner.pt"))
        assert all(torch.isfinite(v).all() for v in state["model"].values())


HUGE_REWARD_ENV = '''
import gymnasium as gym
from gymnasium.envs.classic_control import CartPoleEnv


class HugeReward(CartPoleEnv):
    """Finite rewards whose squares overflow float32: the learner's loss does not stay finite."""

    def step(self, action):
        obs, r, term, trunc, info = super().step(action)
        return obs, 3e38, term, trunc, info


gym.register("HugeReward-v0", entry_point=HugeReward)
'''


def test_a_non_finite_update_stops_the_run_and_is_never_published_or_saved(tmp_path, monkeypatch):
    (tmp_path / "huge_env.py").write_text(HUGE_REWARD_ENV)
    monkeypatch.syspath_prepend(str(tmp_path))
    ck = tmp_path / "ck"
    cfg = small_config(env="huge_env:HugeReward-v0", steps=1_000_000, checkpoint=str(ck))
    result = Runner(cfg, cfg.validate()).run()
    assert "trainer" in result["failure"] and "non-finite" in result["failure"]
    assert "env huge_env:HugeReward-v0" in result["failure"]
    assert_nothing_lost(result)
    assert result["updates"] == 0  # the first update was the bad one: no version published
    import torch

    from runtime.checkpoint import load_state

    state = load_state(str(ck / "learner.pt"))
    assert all(torch.isfinite(v).all() for v in state["model"].values())
    assert state["version"] == 0


def test_a_stopped_trainer_is_reported_as_stalled_and_the_run_goes_on(monkeypatch):
    """A trainer that stops reporting (SIGSTOP) is reported once it has been silent for the
    stall time, and again when it reports once more (SIGCONT); nothing is lost. The step count
    is only a cap: the run is stopped once the trainer has trained again, so a trainer whose
    first report already holds a whole small run is not stopped in the drain, where no stall
    is watched."""
    from runtime import telemetry

    monkeypatch.setattr(telemetry, "STALL_S", 2.0)
    cfg = small_config(steps=10_000_000)
    paused: dict = {}
    runner: Runner

    def pause(state):
        if "at" not in paused and state.trained_steps >= 1_000:
            name = runner.trainer_names()[0]
            paused.update(at=time.monotonic(), pid=runner.services.procs[name].pid, name=name)
            os.kill(paused["pid"], signal.SIGSTOP)
        elif "at" in paused and "resumed" not in paused:
            stalled = any(s["process"] == paused["name"] for s in runner.telemetry.stalls)
            if stalled or time.monotonic() - paused["at"] > 60:
                os.kill(paused["pid"], signal.SIGCONT)
                paused.update(resumed=stalled, steps=state.trained_steps)
        elif "resumed" in paused and state.trained_steps > paused["steps"]:
            runner.stop_requested = True  # trained again: drains as at the end

    runner = Runner(cfg, cfg.validate(), on_progress=pause)
    result = runner.run()
    assert paused.get("resumed"), "the stall was not reported within 60 s"
    (stall,) = [s for s in result["stalls"] if s["process"] == paused["name"]]
    assert stall["silent_s"] >= 2.0
    assert_nothing_lost(result)
    assert result["env_steps"] > paused["steps"]  # the run went on after the stall
