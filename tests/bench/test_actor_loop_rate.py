"""``python -m bench.actor_loop_rate``: an actor's real collect loop and raw stepping, side by
side on every process at once, with their CPU per env step; bad input is refused."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from runtime.actor_placement import BLAS_THREAD_VARS

pytestmark = pytest.mark.slow


def actor_loop_rate(*args: str) -> subprocess.CompletedProcess:
    """The bench in an environment without BLAS thread settings, as a shell's usually is."""
    cmd = [sys.executable, "-m", "bench.actor_loop_rate", *args]
    env = {k: v for k, v in os.environ.items() if k not in BLAS_THREAD_VARS}
    return subprocess.run(cmd, capture_output=True, text=True, timeout=240, env=env)


def test_both_loops_step_and_report_their_cpu_per_step(tmp_path):
    out = tmp_path / "loop.json"
    proc = actor_loop_rate(
        *("--env", "CartPole-v1", "--backend", "gymnasium", "--policy", "auto:16:auto"),
        *("--processes", "2", "--envs-per-actor", "4", "--seconds", "1", "--json", str(out)),
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    doc = json.loads(out.read_text())
    assert doc["env"] == "CartPole-v1" and [r["loop"] for r in doc["results"]] == ["raw", "collect"]
    for r in doc["results"]:
        assert r["processes"] == 2 and r["steps_per_s"] > 0 and r["cpu_ms_per_step"] > 0
        assert r["steps_per_s_per_process"] == pytest.approx(r["steps_per_s"] / 2)
    # collect runs whole rollouts: the policy forward and the bookkeeping cost CPU raw skips
    raw, collect = doc["results"]
    assert collect["cpu_ms_per_step"] > raw["cpu_ms_per_step"]


def test_collect_acts_with_a_learner_states_policy(tmp_path):
    """``--weights``: a policy that always pushes CartPole left ends every episode in about 9
    steps, where random actions last about 22; the loops report the episode lengths."""
    import torch

    from policies.actor_critic import ActorCritic
    from policies.appo import APPOLearner
    from policies.appo_config import APPOConfig

    model = ActorCritic(4, 2, True, "auto:16:auto", True)
    with torch.no_grad():
        model.pi[2].weight.zero_()
        model.pi[2].bias.copy_(torch.tensor([20.0, -20.0]))  # always action 0
    path = tmp_path / "learner.pt"
    torch.save(APPOLearner(model, APPOConfig(), torch.device("cpu")).state(), path)
    out = tmp_path / "loop.json"
    proc = actor_loop_rate(
        *("--env", "CartPole-v1", "--backend", "gymnasium", "--policy", "auto:16:auto"),
        *("--processes", "1", "--envs-per-actor", "4", "--seconds", "1", "--json", str(out)),
        *("--weights", str(path)),
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    raw, collect = json.loads(out.read_text())["results"]
    assert collect["weights"] == str(path) and raw["weights"] is None
    # numpy loads as each process unpickles the state's arrays: with one BLAS thread, as an
    # actor has (a thread per core in every process made the loop 5x dearer per step)
    assert collect["blas_threads"] == raw["blas_threads"] == ["1"]
    assert collect["episode_len"] < 12 < raw["episode_len"], (raw, collect)


def test_bad_input_is_refused_with_what_is_allowed():
    proc = actor_loop_rate("--env", "CartPole-v1", "--loops", "raw,fast")
    assert proc.returncode == 2 and "allowed are raw, collect" in proc.stderr
    proc = actor_loop_rate("--env", "CartPole-v1", "--seconds", "0")
    assert proc.returncode == 2 and "--seconds > 0" in proc.stderr
    proc = actor_loop_rate("--env", "CartPole-v1", "--weights", "/nonexistent/learner.pt")
    assert proc.returncode == 2 and "--weights" in proc.stderr and "not loaded" in proc.stderr
    proc = actor_loop_rate("--env", "NoSuchEnv-v0", "--seconds", "1")
    assert proc.returncode == 2 and "NoSuchEnv-v0" in proc.stderr
