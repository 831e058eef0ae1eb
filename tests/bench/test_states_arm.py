"""The peers suite's ``states`` arm: the actor's loop on every core acting with the policy the
``default`` arm ended with, and the report's figures at those states (the most a learning run's
states allow beside the limit and the second limit); its command, its refusals, and one real
arm on this CPU."""

from __future__ import annotations

import argparse
import json

import pytest

from bench import compare, compare_arms, payoff_report
from bench.machine_meter import MachineMeter
from tests.bench.test_payoff_report import Meter, arm


def namespace(tmp_path, **extra) -> argparse.Namespace:
    a = argparse.Namespace(env="CartPole-v1", policy="auto:16:auto", seconds=5.0, startup_s=4.0)
    a.out, a.exports, a.peer_rollout, a.states_s = str(tmp_path), {}, 2048, 1.0
    for k, v in extra.items():
        setattr(a, k, v)
    return a


def always_left(path) -> None:
    """A CartPole learner state whose policy always pushes left: episodes of about 9 steps,
    where random actions last about 22."""
    import torch

    from policies.actor_critic import ActorCritic
    from policies.appo import APPOLearner
    from policies.appo_config import APPOConfig

    model = ActorCritic(4, 2, True, "auto:16:auto", True)
    with torch.no_grad():
        model.pi[2].weight.zero_()
        model.pi[2].bias.copy_(torch.tensor([20.0, -20.0]))
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(APPOLearner(model, APPOConfig(), torch.device("cpu")).state(), path)


def default_result(tmp_path, backend: str = "gymnasium", k: int = 4) -> None:
    doc = {"config": {"env_backend": backend, "envs_per_actor": k, "actors": 2}}
    (tmp_path / "CartPole-v1-default.result.json").write_text(json.dumps(doc))


def test_the_default_arm_keeps_its_policy_only_where_a_states_arm_follows(tmp_path):
    a = namespace(tmp_path, arm_list=["limit", "default"])
    assert "--checkpoint" not in compare_arms.arm_command("default", a, "p.jsonl", "r.json")
    a.arm_list = ["limit", "default", "states"]
    cmd = compare_arms.arm_command("default", a, "p.jsonl", "r.json")
    where = compare_arms.default_checkpoint(tmp_path, "CartPole-v1")
    assert cmd[cmd.index("--checkpoint") + 1] == str(where)


def test_the_states_arm_needs_the_default_arms_result_and_policy(tmp_path):
    a = namespace(tmp_path)
    with pytest.raises(SystemExit, match=r"no default arm's result .* \(list default first\)"):
        compare_arms.arm_command("states", a, "p.jsonl", "r.json")
    default_result(tmp_path, backend="envpool", k=64)
    with pytest.raises(SystemExit, match="the default arm left no policy in"):
        compare_arms.arm_command("states", a, "p.jsonl", "r.json")
    weights = compare_arms.default_checkpoint(tmp_path, "CartPole-v1") / "learner.pt"
    weights.parent.mkdir()
    weights.write_bytes(b"")
    cmd = compare_arms.arm_command("states", a, "p.jsonl", "r.json")
    assert cmd[2] == "bench.actor_loop_rate" and cmd[cmd.index("--loops") + 1] == "collect,raw"
    assert cmd[cmd.index("--backend") + 1] == "envpool"  # the run's own backend and shape
    assert cmd[cmd.index("--envs-per-actor") + 1] == "64"
    assert cmd[cmd.index("--weights") + 1] == str(weights)
    assert cmd[cmd.index("--processes") + 1] == "0" and cmd[cmd.index("--seconds") + 1] == "1.0"


def test_a_loop_is_metered_over_its_own_span_and_a_window_counts_its_episodes():
    loop = {"loop": "collect", "steps_per_s": 1500.0, "started_unix": 10.0, "ended_unix": 20.0}
    doc = compare.loop_figures(loop, Meter())  # 100 W of GPU, 50 of CPU
    assert doc["gpu_w"] == pytest.approx(100) and doc["cpu_w"] == pytest.approx(50)
    assert doc["steps_per_joule"] == pytest.approx(10.0) and doc["loop"] == "collect"
    rows = [{"t": 0.0, "steps": 0, "episodes": 0}]
    rows += [{"t": t, "steps": 1500 * (t - 10), "episodes": 30 * (t - 10)} for t in range(10, 61)]
    assert compare.measure(rows, Meter(), warmup_s=5)["episode_len"] == pytest.approx(50.0)
    for r in rows:
        r["episodes"] = None  # a peer that does not count its episodes
    assert compare.measure(rows, Meter(), warmup_s=5)["episode_len"] is None


def test_the_report_sets_the_default_arm_beside_the_most_its_states_allow():
    gpu = {"device": "cuda", "batch_size": 65536, "samples_per_s": 1e6, "fixed_w": 40.0}
    gpu |= {"busy_j_per_sample": 1e-5, "marginal_j_per_sample": 5e-5}
    loops = {
        "collect": {"steps_per_s": 24_000.0, "steps_per_joule": 85.0, "episode_len": 78.0},
        "raw": {"steps_per_s": 33_000.0, "steps_per_joule": 115.0, "episode_len": 25.0},
    }
    arms = {
        "limit": arm("limit", 100.0),  # 30k steps/s
        "learner": {"arm": "learner", "learner": {"settings": [gpu], "best": gpu}},
        "default": arm("default", 70.0, config={"envs_per_actor": 32}),
        "states": {"arm": "states", "loops": loops},
    }
    arms["default"]["final_third"] = {"steps_per_s": 20_000.0, "episode_len": 70.0}
    s = payoff_report.summary(arms)
    assert "states" not in s["rows"]  # no trained steps of its own
    st = s["states"]
    limit2 = 1 / (1 / 85 + 40 / 24_000 + 1e-5)  # the learner charged at the loop's rate
    assert st["limit2"] == pytest.approx(limit2)
    assert st["vs_limit2"] == pytest.approx(limit2 / s["limits"]["limit2"])
    assert st["steps_per_s_vs_limit"] == pytest.approx(0.8)
    assert st["default_vs_it"] == pytest.approx(70 / limit2)
    goal = s["goals"]["best steps/J vs second limit"]
    assert goal["at_most_at_its_states"] == pytest.approx(st["vs_limit2"])
    text = payoff_report.markdown(("r", "Ant-v5", "p"), s)
    assert f"(at most {st['vs_limit2']:.2f} at the default arm's states)" in text
    assert "policy, 32 envs per actor): 24,000 steps/s, 85.0 steps/J, episodes of 78.0" in text
    assert "(the arm's final third: 70.0; random actions at that shape: 33,000" in text
    del arms["states"]
    assert payoff_report.summary(arms)["states"] is None


@pytest.mark.slow
def test_a_states_arm_runs_on_this_cpu(tmp_path):
    """The arm itself: both loops on every core with the default arm's policy, metered."""
    default_result(tmp_path)
    always_left(compare_arms.default_checkpoint(tmp_path, "CartPole-v1") / "learner.pt")
    meter = MachineMeter().start()
    try:
        doc = compare.run_arm("states", namespace(tmp_path), meter, tmp_path)
    finally:
        meter.stop()
    assert doc["returncode"] == 0 and "error" not in doc, doc
    collect, raw = doc["loops"]["collect"], doc["loops"]["raw"]
    assert collect["episode_len"] < 12 < raw["episode_len"], (collect, raw)
    for loop in (collect, raw):
        assert loop["steps_per_s"] > 0 and loop["steps_per_joule"] > 0 and loop["cpu_w"] > 0
        assert loop["ended_unix"] > loop["started_unix"] >= doc["started_unix"]
    saved = json.loads((tmp_path / "CartPole-v1-states.json").read_text())
    assert saved["loops"]["collect"]["steps_per_s"] == collect["steps_per_s"]
