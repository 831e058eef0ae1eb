"""Whether tuning pays for itself, as the peers report computes it: whole-run figures under both
CPU models, the second limit from the learner alone, and the tuning goals; the learner-alone
measurement on this CPU; the TPE arm's command."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

import pytest

from bench import compare, compare_arms, learner_limit, payoff_report
from bench.compare_report import report


class Meter:
    """A meter that charged 100 J/s of GPU, 50 J/s of CPU, of which 20 J/s idle, from t=0."""

    has_idle_part = True

    def __init__(self) -> None:
        self.samples = [(0.0, 0.0, 0.0, 0.0), (1000.0, 1e5, 5e4, 2e4)]

    def parts_at(self, t: float) -> tuple[float, float, float]:
        if not 0 <= t <= 1000:
            raise ValueError("outside")
        return 100.0 * t, 50.0 * t, 20.0 * t

    def at(self, t: float) -> tuple[float, float]:
        return self.parts_at(t)[:2]


def test_measure_gives_the_whole_run_under_both_cpu_models_and_a_curve():
    # started at 0, first trained step at 10 s, then 1500 steps/s
    rows = [{"t": 0.0, "steps": 0}] + [{"t": t, "steps": 1500 * (t - 10)} for t in range(10, 61)]
    doc = compare.measure(rows, Meter(), warmup_s=5, final_third=False, started=0.0)
    assert doc["steps_per_s"] == pytest.approx(1500)
    assert doc["steps_per_joule"] == pytest.approx(1500 / 150)
    assert doc["steps_per_joule_busy_only"] == pytest.approx(1500 / 130)
    whole = doc["whole_run"]
    assert whole["wall_s"] == 60 and whole["steps"] == 75_000
    assert whole["steps_per_joule"] == pytest.approx(75_000 / (150 * 60))
    assert whole["steps_per_joule_busy_only"] == pytest.approx(75_000 / (130 * 60))
    assert [c["t"] for c in doc["curve"]] == [10, 20, 30, 40, 50, 60]
    assert doc["curve"][0]["steps_per_joule"] == 0 and doc["curve"][-1]["steps_per_s"] == 1500


def test_under_rapl_no_busy_only_figure_is_made_up():
    """RAPL measures the packages whole: there is no idle part to leave out, so the busy-only
    figures are None, not the whole-package ones again."""

    class Rapl(Meter):
        has_idle_part = False

    rows = [{"t": 0.0, "steps": 0}] + [{"t": t, "steps": 1500 * (t - 10)} for t in range(10, 61)]
    doc = compare.measure(rows, Rapl(), warmup_s=5, final_third=False, started=0.0)
    assert doc["steps_per_joule"] == pytest.approx(1500 / 150)
    assert doc["steps_per_joule_busy_only"] is None
    assert doc["whole_run"]["steps_per_joule_busy_only"] is None


def arm(name: str, spj: float, **extra) -> dict:
    return {
        "arm": name,
        "env": "Ant-v5",
        "policy": "p",
        "command": [],
        "gpu": "nvml",
        "cpu": "model",
        "steps_per_s": spj * 300,
        "gpu_w": 200.0,
        "cpu_w": 100.0,
        "steps_per_joule": spj,
        "steps_per_joule_busy_only": spj * 1.2,
        **extra,
    }


KNOBS = {"actors": 15, "envs_per_actor": 32, "batch_size": 16384}


def tuned(whole: float, curve: list[float], windows: list[tuple[float, float, float]]) -> dict:
    return {
        "whole_run": {"steps_per_joule": whole, "steps_per_joule_busy_only": whole, "wall_s": 300},
        "curve": [{"t": 10.0 * (i + 1), "steps_per_joule": v} for i, v in enumerate(curve)],
        "started_unix": 1000.0,
        "tuning": {
            "windows": [
                {"t": t, "at": 1000 + t, "objective": o, "incumbent": inc, "values": KNOBS}
                for t, o, inc in windows
            ]
        },
    }


def test_the_payoff_goals_from_stored_arms(tmp_path):
    learner = {"learner": {"best": {"marginal_j_per_sample": 1e-3, "device": "cuda"}}}
    arms = {
        "limit": arm("limit", 100.0),
        "learner": {"arm": "learner", "env": "Ant-v5", "policy": "p", "command": [], **learner},
        "exported": arm("exported", 80.0),
        "default": arm("default", 82.0),
        "tuned": arm("tuned", 85.0, **tuned(76.0, [20, 60, 78, 79, 80], [(70, 60, 80)])),
        "tuned-tpe": arm("tuned-tpe", 60.0, **tuned(50.0, [20, 30, 40], [(70, 20, 60)])),
    }
    s = payoff_report.summary(arms)
    assert s["limits"]["limit2"] == pytest.approx(1 / (1 / 100 + 1e-3))
    assert s["static"] == "exported"
    g = s["goals"]
    assert g["auto sizing steps/J vs limit"]["value"] == pytest.approx(0.82)
    assert g["auto sizing steps/J vs limit"]["met"] is True
    assert g["tuned whole-run steps/J vs best static"]["value"] == pytest.approx(0.95)
    assert g["tuned whole-run steps/J vs TPE's"]["value"] == pytest.approx(76 / 50)
    # the trailing 20 s first reach 0.95 x 80 = 76 at 40 s (78 and 79: 78.5)
    assert g["tuned reaches 0.95 of best static (s)"]["value"] == 40.0
    # 60 < 0.7 x 80 = 56? no: no breach; TPE's own windows are not this goal's
    assert g["tuned windows under 0.7 of the incumbent after 60 s"]["met"] is True
    assert g["best steps/J vs second limit"]["value"] == pytest.approx(85 / s["limits"]["limit2"])
    breach = tuned(76.0, [], [(30, 10, 80), (61, 50, 80)])["tuning"]["windows"]
    assert payoff_report.floor_breaches(breach) == [{"t": 61, "objective": 50, "incumbent": 80}]

    # the peers report adds the section and its plot where the arms are there
    run = tmp_path / "Ant-v5"
    run.mkdir()
    for name, doc in arms.items():
        (run / f"Ant-v5-{name}.json").write_text(json.dumps(doc))
    md, plots = tmp_path / "t.md", tmp_path / "plots"
    doc = report(tmp_path, str(md), str(plots))
    assert "Ant-v5 p (Ant-v5) payoff" in doc["goals"]
    text = md.read_text()
    assert "second limit" in text and "| tuned-tpe |" in text
    assert (plots / "payoff-Ant-v5-Ant-v5-p.png").stat().st_size > 10_000


def test_the_second_limit_charges_the_learner_at_the_limits_step_rate():
    # a GPU learner: 40 W held by its context, 10 uJ busy per sample, 1M samples/s alone;
    # a CPU learner: nothing held, 1 mJ per sample, but only 20k samples/s
    gpu = {"device": "cuda", "batch_size": 65536, "samples_per_s": 1e6, "fixed_w": 40.0}
    gpu |= {"busy_j_per_sample": 1e-5, "marginal_j_per_sample": 5e-5}
    cpu = {"device": "cpu", "batch_size": 4096, "samples_per_s": 2e4, "fixed_w": 0.0}
    cpu |= {"busy_j_per_sample": 1e-3, "marginal_j_per_sample": 1e-3}
    learner = {"learner": {"settings": [cpu, gpu], "best": gpu}}
    arms = {"limit": arm("limit", 100.0), "learner": {"arm": "learner", **learner}}
    # the limit steps 30k/s: the CPU learner cannot keep up; the GPU's 40 W over 30k samples/s
    lim = payoff_report.second_limit(arms)
    at = 40.0 / 30_000 + 1e-5
    assert lim["learner_at_rate"]["device"] == "cuda" and lim["learner_at_rate"]["keeps_up"]
    assert lim["learner_at_rate"]["j_per_sample"] == pytest.approx(at)
    assert lim["limit2"] == pytest.approx(1 / (1 / 100 + at))
    assert lim["limit2_own_rate"] == pytest.approx(1 / (1 / 100 + 5e-5))
    text = payoff_report.markdown(("r", "Ant-v5", "p"), payoff_report.summary(arms))
    assert "fed the limit's 30,000 steps/s: 1,343.33 uJ/sample (cuda, batch 65536: " in text
    assert "40.0 W held + 10.00 uJ busy); second limit 88.2 steps/J" in text
    assert "its own best rate: 99.5)" in text
    # a slower limit (10k steps/s) the CPU learner keeps up with, at 1 mJ < 4 mJ + 10 uJ
    arms["limit"] = arm("limit", 100.0, steps_per_s=10_000.0)
    assert payoff_report.second_limit(arms)["learner_at_rate"]["device"] == "cpu"
    # a limit faster than every setting: the cheapest at its own rate, and said so
    arms["limit"] = arm("limit", 100.0, steps_per_s=2e6)
    lim = payoff_report.second_limit(arms)
    assert lim["learner_at_rate"]["keeps_up"] is False
    assert lim["learner_at_rate"]["j_per_sample"] == pytest.approx(40.0 / 1e6 + 1e-5)
    text = payoff_report.markdown(("r", "Ant-v5", "p"), payoff_report.summary(arms))
    assert "no learner setting keeps up with the limit's 2,000,000 steps/s" in text
    # a learner measured before the rest was: its own rate, and said so; none at all: said so
    arms["learner"]["learner"] = {
        "best": {**cpu, "fixed_w": None} | {"marginal_j_per_sample": 2e-3}
    }
    del arms["learner"]["learner"]["best"]["fixed_w"]
    text = payoff_report.markdown(("r", "Ant-v5", "p"), payoff_report.summary(arms))
    assert "the learner at its own best rate (its rest not measured): 2,000.00 uJ" in text
    del arms["learner"]
    text = payoff_report.markdown(("r", "Ant-v5", "p"), payoff_report.summary(arms))
    assert "no learner measured; second limit - steps/J" in text


def test_the_tpe_arm_runs_the_same_tuning_with_tpe():
    a = argparse.Namespace(
        env="Ant-v5",
        policy="auto:32:auto",
        seconds=5.0,
        startup_s=4.0,
        tuned_s=30.0,
        knob=None,
        tune_space="full",
        out="/tmp/x",
        exports={},
        peer_rollout=2048,
    )
    model = compare_arms.arm_command("tuned", a, "p.jsonl", "r.json")
    tpe = compare_arms.arm_command("tuned-tpe", a, "p.jsonl", "r.json")
    assert model[model.index("--tune-sampler") + 1] == "model"
    assert tpe[tpe.index("--tune-sampler") + 1] == "tpe" and "--knob" not in tpe
    assert compare_arms.arm_kind("tuned-tpe") == "tuned"
    a.tune_space = "narrow"
    assert "--knob" in compare_arms.arm_command("tuned", a, "p.jsonl", "r.json")


def test_the_tuned_best_arm_runs_the_tuned_arms_best_as_a_static_config(tmp_path):
    a = argparse.Namespace(
        env="Ant-v5", policy="auto", seconds=5.0, startup_s=4.0, out=str(tmp_path), exports={}
    )
    a.peer_rollout = 2048
    with pytest.raises(SystemExit, match="run the tuned arm first"):
        compare_arms.arm_command("tuned-best", a, "p.jsonl", "r.json")
    best = {"actors": 15, "envs_per_actor": 32, "trainer_device": "cuda", "mps_pct": 50}
    doc = {"tuning": {"best": {"values": best, "objective": 105.0}}}
    (tmp_path / "Ant-v5-tuned.result.json").write_text(json.dumps(doc))
    cmd = compare_arms.arm_command("tuned-best", a, "p.jsonl", "r.json")
    assert cmd[cmd.index("--envs-per-actor") + 1] == "32" and "--tune" not in cmd
    assert cmd[cmd.index("--trainer-device") + 1] == "cuda"
    assert compare_arms.arm_kind("tuned-best") == "exported"  # a static config in the report


@pytest.mark.slow
def test_learner_alone_on_this_cpu(tmp_path):
    out = tmp_path / "l.json"
    cmd = [sys.executable, "-m", "bench.learner_limit", "--env", "CartPole-v1", "--devices"]
    cmd += ["cpu", "--batches", "1024,2048", "--seconds", "0.5", "--idle-s", "0.5"]
    proc = subprocess.run([*cmd, "--json", str(out)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    doc = json.loads(out.read_text())
    assert [r["batch_size"] for r in doc["settings"]] == [1024, 2048]
    assert all(r["updates"] >= 1 and r["samples_per_s"] > 0 for r in doc["settings"])
    assert doc["idle_w"] > 0 and doc["best"] in doc["settings"]
    # each device's rest is measured with its learner made, and every row priced against it
    assert set(doc["rest_w"]) == {"cpu"} and doc["rest_w"]["cpu"] > 0
    for r in doc["settings"]:
        assert r["fixed_w"] == pytest.approx(max(doc["rest_w"]["cpu"] - doc["idle_w"], 0.0))
        # its watts above rest, per sample: what it adds fed as fast as it trains
        above = max(r["watts"] - doc["rest_w"]["cpu"], 0.0) / r["samples_per_s"]
        assert r["busy_j_per_sample"] == pytest.approx(above, rel=0.05, abs=1e-9)
        half = r["samples_per_s"] / 2  # fed half its rate, its fixed watts weigh twice
        assert learner_limit.cost_at(r, half) == pytest.approx(
            r["fixed_w"] / half + above, rel=0.05, abs=1e-9
        )
        assert learner_limit.cost_at(r, 2 * r["samples_per_s"]) is None  # cannot keep up
    bad_cmd = [*cmd[:6], "gpu", "--json", str(out)]
    bad = subprocess.run(bad_cmd, capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "--devices: unknown ['gpu']" in bad.stderr
