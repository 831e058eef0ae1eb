"""bench.compare and bench.learning end to end on the CPU with tiny budgets (the figures belong in
docs/BENCHMARKS.md, measured on the device machine), and their refusals of bad input."""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from autotune.workflows.progress_log import read_progress
from bench import compare, compare_arms


def bench(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", *args], capture_output=True, text=True, timeout=timeout
    )


def config(path, **fields) -> str:
    doc = {
        "env": "Pendulum-v1",
        "actors": 1,
        "envs_per_actor": 4,
        "batch_size": 512,
        "trainer_device": "cpu",
        **fields,
    }
    path.write_text(json.dumps(doc))
    return str(path)


@pytest.mark.slow
def test_compare_arms_then_report(tmp_path):
    """The limit, both peers and an exported config run and are measured; then the report's
    table, goals and plots. (The default arm is plain ``autotune train`` and the tuned arm
    ``train --tune``, both run end to end by the CLI's and the tuner's tests; their commands,
    the final-third window and labelled exported arms are checked below.)"""
    out = tmp_path / "run"
    proc = bench(
        "bench.compare",
        "run",
        "--env",
        "Pendulum-v1",
        "--policy",
        "auto:32:auto",
        "--seconds",
        "4",
        "--startup-s",
        "6",
        "--warmup-s",
        "1",
        "--settle-s",
        "0",
        "--peer-rollout",
        "256",
        "--arms",
        "limit,sb3-cpu,cleanrl,exported",
        "--exported",
        config(tmp_path / "a.json"),
        "--out",
        str(out),
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    docs = [p for p in out.glob("Pendulum-v1-*.json") if not p.name.endswith(".result.json")]
    arms = {p.stem.split("-", 2)[-1]: json.loads(p.read_text()) for p in docs}
    assert set(arms) == {"limit", "sb3-cpu", "cleanrl", "exported"}
    for name, doc in arms.items():
        assert "error" not in doc, (name, doc)
        assert doc["steps_per_s"] > 0 and doc["steps_per_joule"] > 0, name
        assert doc["cpu"] in ("rapl", "model"), name
        curve = read_progress(out / f"Pendulum-v1-{name}.progress.jsonl")
        steps = [r["steps"] for r in curve]
        assert steps == sorted(steps) and steps[-1] > 0, name
    assert arms["exported"]["config"]["envs_per_actor"] == 4
    assert arms["exported"]["lost_steps"] == 0
    md, plots = tmp_path / "table.md", tmp_path / "plots"
    proc = bench(
        "bench.compare",
        "report",
        "--dir",
        str(tmp_path),
        "--markdown",
        str(md),
        "--plots",
        str(plots),
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    goals = json.loads(proc.stdout)
    (group,) = goals.values()
    assert set(group) == {"trained steps/s vs limit", "steps/J vs SB3 best", "steps/J vs limit"}
    assert all(g["ratio"] > 0 and isinstance(g["met"], bool) for g in group.values())
    text = md.read_text()
    assert "| exported |" in text and "| limit | " in text and "goal >= 7.0" in text
    (png,) = plots.glob("*.png")
    assert png.stat().st_size > 10_000


def test_labelled_exported_arms_run_their_own_files(tmp_path):
    a_file, b_file = config(tmp_path / "a.json"), config(tmp_path / "b.json", envs_per_actor=8)
    exports = compare_arms.exported_arms([a_file, f"two={b_file}"])
    assert exports == {"exported": tmp_path / "a.json", "exported-two": tmp_path / "b.json"}
    a = argparse.Namespace(
        env="Pendulum-v1",
        policy="auto:32:auto",
        seconds=5.0,
        startup_s=4.0,
        exports=exports,
        peer_rollout=512,
    )
    for peer in ("sb3-cpu", "cleanrl"):
        cmd = compare_arms.arm_command(peer, a, tmp_path / "p.jsonl", tmp_path / "r.json")
        assert cmd[cmd.index("--rollout") + 1] == "512"
    for arm, file in exports.items():
        assert compare_arms.arm_kind(arm) == "exported"
        cmd = compare_arms.arm_command(arm, a, tmp_path / "p.jsonl", tmp_path / "r.json")
        assert cmd[cmd.index("--config") + 1] == str(file)
        assert cmd[cmd.index("--max-wall-s") + 1] == "9.0"
    # the default arm: `autotune train` as a newcomer runs it (the CLI's runs are tested in
    # tests/cli), with the arm's wall budget and the shared policy
    cmd = compare_arms.arm_command("default", a, tmp_path / "p.jsonl", tmp_path / "r.json")
    assert cmd[2:4] == ["autotune.cli.main", "train"] and "--config" not in cmd
    assert cmd[cmd.index("--env") + 1] == "Pendulum-v1"
    assert cmd[cmd.index("--policy") + 1] == "auto:32:auto"
    assert cmd[cmd.index("--max-wall-s") + 1] == "9.0"


def test_report_of_the_stored_h100_cpu_trainer_run_keeps_its_figures(tmp_path):
    """The report on the device's stored results (a labelled exported arm beside the limit and
    the cuda export) gives the figures docs/BENCHMARKS.md quotes."""
    from bench.compare_report import report

    src = Path(__file__).parents[1] / "fixtures/compare/cpu-trainer"
    shutil.copytree(src, tmp_path / "run")
    doc = report(tmp_path, str(tmp_path / "t.md"), None)
    (group,) = doc["groups"]
    assert list(group["ratios"]) == ["limit", "exported", "exported-cpu"]
    assert round(group["ratios"]["exported-cpu"]["steps_per_joule_vs_limit"], 3) == 0.782
    text = (tmp_path / "t.md").read_text()
    assert "| limit | 24,099 | 72 | 160 | 103.7 |" in text
    assert "| exported-cpu | 15,312 | 73 | 115 | 81.1 | 0.64 | 0.78 |" in text
    assert "- steps/J vs limit: 0.796 (exported), goal >= 0.8: NOT met" in text


def test_report_of_the_stored_numpy_actor_runs_keeps_the_quoted_ratios(tmp_path):
    """docs/BENCHMARKS.md section 10 quotes these three runs' steps/J ratios to the limit."""
    from bench.compare_report import report

    src = Path(__file__).parents[1] / "fixtures/compare/numpy-actors"
    for run in ("run1", "run2", "run3"):
        shutil.copytree(src / run, tmp_path / run)
    doc = report(tmp_path, None, None)
    ratios = {
        g["run"]: {arm: round(r["steps_per_joule_vs_limit"], 2) for arm, r in g["ratios"].items()}
        for g in doc["groups"]
    }
    assert ratios == {
        "run1": {"limit": 1.0, "exported": 0.84, "exported-cpu": 0.92},
        "run2": {"limit": 1.0, "exported": 0.73, "exported-cpu": 0.7},
        "run3": {"limit": 1.0, "exported": 0.85, "exported-cpu": 0.93},
    }
    (across,) = doc["across_runs"]  # the three runs, each arm's ratios side by side
    assert across["runs"] == ["run1", "run2", "run3"]
    spj = across["arms"]["exported-cpu"]["steps_per_joule_vs_limit"]
    assert [round(x, 2) for x in spj["values"]] == [0.92, 0.7, 0.93]
    assert (round(spj["median"], 2), spj["met"], spj["runs"]) == (0.92, 2, 3)


def test_report_of_the_stored_rounds_counts_the_runs_that_met_each_goal(tmp_path):
    """docs/BENCHMARKS.md section 10 quotes these rounds (2026-11-23, each between its own
    two limits)."""
    from bench.compare_report import report

    src = Path(__file__).parents[1] / "fixtures/compare/others-rounds"
    shutil.copytree(src, tmp_path / "rounds")
    md = tmp_path / "t.md"
    doc = report(tmp_path / "rounds", str(md), None)
    across = {a["env"] + " " + a["policy"]: a["arms"]["exported"] for a in doc["across_runs"]}
    humanoid = across["Humanoid-v5 auto:400:200:100:auto"]
    heavy = across["Ant-v5 auto:1024:1024:512:auto"]
    assert [round(x, 2) for x in humanoid["steps_per_s_vs_limit"]["values"]] == [0.81, 0.75]
    assert humanoid["steps_per_s_vs_limit"]["met"] == 1
    assert [round(x, 2) for x in heavy["steps_per_s_vs_limit"]["values"]] == [0.91, 0.81]
    assert heavy["steps_per_s_vs_limit"]["met"] == 2
    assert heavy["steps_per_joule_vs_limit"]["met"] == 0
    row = "| exported | 0.81, 0.75 | 0.78 | 1 of 2 | 0.71, 0.64 | 0.67 | 0 of 2 |"
    assert row in md.read_text()


def test_a_limit_measured_again_gives_the_mean_and_its_drift(tmp_path):
    """``--limit-again``: the ratios are to the mean of the two limits, and the drift between
    them is printed (here run 2's limit, 25 % faster, stands in for the second)."""
    from bench.compare_report import report

    src = Path(__file__).parents[1] / "fixtures/compare/numpy-actors"
    shutil.copytree(src / "run1", tmp_path / "run")
    end = json.loads((src / "run2" / "Ant-v5-limit.json").read_text())
    end["arm"] = compare_arms.LIMIT_END
    (tmp_path / "run" / "Ant-v5-limit-end.json").write_text(json.dumps(end))
    doc = report(tmp_path, str(tmp_path / "t.md"), None)
    (group,) = doc["groups"]
    mean_spj = (136.48 + 170.01) / 2
    assert group["limit_drift"] == pytest.approx(39781.21 / 31934.61, rel=1e-4)
    got = group["ratios"]["exported-cpu"]["steps_per_joule_vs_limit"]
    assert got == pytest.approx(125.14 / mean_spj, rel=1e-3)
    text = (tmp_path / "t.md").read_text()
    assert "| limit-end | 39,781 |" in text and "- limit drift: 1.246" in text
    with pytest.raises(SystemExit, match="add limit to --arms"):
        compare.main(["run", "--arms", "default", "--limit-again", "--out", str(tmp_path)])


def test_tuned_arm_command_and_final_third_window(tmp_path):
    a = argparse.Namespace(
        env="Pendulum-v1",
        policy="auto:32:auto",
        seconds=5.0,
        startup_s=4.0,
        tuned_s=30.0,
        knob=["batch_size=512,1024"],
        out=str(tmp_path),
        exports={},
        peer_rollout=2048,
    )
    cmd = compare_arms.arm_command("tuned", a, tmp_path / "p.jsonl", tmp_path / "r.json")
    assert cmd[cmd.index("--max-wall-s") + 1] == "30.0" and "--tune" in cmd
    assert cmd[cmd.index("--knob") + 1] == "batch_size=512,1024"
    assert cmd[cmd.index("--storage") + 1] == f"sqlite:///{tmp_path.resolve()}/tuned.db"
    rows = [
        {"t": t, "steps": s}
        for t, s in ((0, 0), (10, 100), (20, 1100), (30, 2100), (40, 4100), (49, 6000))
    ]
    first, last = compare.window(rows, warmup_s=2, final_third=True)
    assert (first["t"], last["t"]) == (40, 49)  # the trained span 10..49: its last 13 s
    first, last = compare.window(rows, warmup_s=2, final_third=False)
    assert (first["t"], last["t"]) == (20, 49)
    with pytest.raises(ValueError, match="run the arm longer"):
        compare.window(rows[:3], warmup_s=15, final_third=False)


@pytest.mark.slow
def test_learning_runs_resume_and_report(tmp_path, capsys):
    """sb3 and ours runs stopped by --max-wall-s and resumed from their checkpoints by the same
    command; then the report. (The cleanrl arm's command is checked below; the peer itself
    runs in the compare test.)"""
    out = tmp_path / "learn"
    common = [
        "bench.learning",
        "run",
        "--env",
        "Pendulum-v1",
        "--policy",
        "auto:32:auto",
        "--out",
        str(out),
        "--ours-args",
        "--batch-size 512 --envs-per-actor 4",
        "--peer-rollout",
        "256",
    ]
    # sb3: stopped by --max-wall-s (its --seconds start at its training), then resumed to the end;
    # rollouts of 256 so that it trains some in 2 s on a loaded machine (2048 trained none once)
    long = [*common, "--arms", "sb3", "--seeds", "7", "--steps", "8192"]
    proc = bench(*long, "--max-wall-s", "2")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    first = json.loads((out / "Pendulum-v1-sb3-seed7.json").read_text())
    assert not first["finished"] and 0 < first["trained_steps"] < 8192, first
    assert (out / "Pendulum-v1-sb3-seed7.checkpoint" / "model.zip").is_file()
    proc = bench(*long)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert json.loads((out / "Pendulum-v1-sb3-seed7.json").read_text())["finished"]
    log = (out / "Pendulum-v1-sb3-seed7.log").read_text()
    assert f"resumed from {out / 'Pendulum-v1-sb3-seed7.checkpoint'} at" in log
    from bench.learning import main  # finished runs are skipped (in this process: none starts)

    assert main(long[1:]) == 0
    assert "already at 8192 steps, skipped" in capsys.readouterr().out
    # ours: two sittings of a run too long for either; the second goes on from the first
    long = [*common, "--arms", "ours", "--seeds", "7", "--steps", "5000000", "--max-wall-s", "7"]
    reached = []
    for _ in range(2):
        proc = bench(*long)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
        doc = json.loads((out / "Pendulum-v1-ours-seed7.json").read_text())
        assert not doc["finished"] and doc["trained_steps"] > (reached or [0])[-1], doc
        reached.append(doc["trained_steps"])
    log = (out / "Pendulum-v1-ours-seed7.log").read_text()
    assert f"going on from {reached[0]} trained steps" in log
    assert (out / "Pendulum-v1-ours-seed7.checkpoint" / "learner.pt").is_file()
    for arm, last in (("sb3", 8192), ("ours", reached[1])):
        steps_seen = [
            r["steps"] for r in read_progress(out / f"Pendulum-v1-{arm}-seed7.progress.jsonl")
        ]
        assert steps_seen == sorted(steps_seen) and steps_seen[0] == 0 and steps_seen[-1] >= last
    assert first["trained_steps"] in [
        r["steps"] for r in read_progress(out / "Pendulum-v1-sb3-seed7.progress.jsonl")
    ]
    assert reached[0] in [
        r["steps"] for r in read_progress(out / "Pendulum-v1-ours-seed7.progress.jsonl")
    ]
    md = tmp_path / "t.md"
    proc = bench(
        "bench.learning",
        "report",
        "--dir",
        str(out),
        "--at",
        "2048,4096",
        "--markdown",
        str(md),
        "--plot",
        str(tmp_path / "r.png"),
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = {r["arm"]: r for r in json.loads(proc.stdout)}
    assert rows["ours"]["seeds"] == [7] and rows["ours"]["4096"]["n"] == 1
    assert rows["sb3"]["seeds"] == [7] and rows["sb3"]["4096"]["n"] == 1
    assert "| Pendulum-v1 | ours | 1 |" in md.read_text()
    assert (tmp_path / "r.png").stat().st_size > 10_000


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--arms", "limit,sb3"], "--arms: unknown ['sb3']; allowed limit, sb3-cpu"),
        (["--arms", "exported"], "the exported arm needs --exported FILE"),
        (["--arms", "exported", "--exported", "x y=a.json"], "a label is letters, digits"),
        (["--arms", "exported", "--exported", "nothing.json"], "no such file 'nothing.json'"),
        (["--seconds", "0"], "--seconds and --tuned-s must be > 0"),
        (["--peer-rollout", "0"], "--peer-rollout >= 1"),
    ],
)
def test_compare_refuses_bad_input(tmp_path, args, message):
    proc = bench("bench.compare", "run", *args, "--out", str(tmp_path / "o"), timeout=60)
    assert proc.returncode == 2 or proc.returncode == 1
    assert message in proc.stderr, proc.stderr


def test_compare_exported_twice_refused(tmp_path):
    cfg = config(tmp_path / "a.json")
    proc = bench(
        "bench.compare",
        "run",
        "--arms",
        "exported",
        "--exported",
        cfg,
        "--exported",
        cfg,
        "--out",
        str(tmp_path / "o"),
        timeout=60,
    )
    assert "the arm 'exported' is given twice" in proc.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["run", "--arms", "ours,zoo"], "--arms: unknown ['zoo']"),
        (["run", "--seeds", "a,b"], "--seeds 'a,b': expected integers"),
        (["run", "--parallel", "999"], "--parallel 999: more runs at once"),
        (["run", "--max-wall-s", "-1"], "--max-wall-s >= 0"),
        (["run", "--peer-rollout", "0"], "--peer-rollout must be >= 1"),
        (["report"], "no `bench.learning run` results under"),
        (["report", "--at", "x"], "--at 'x': expected step counts"),
    ],
)
def test_learning_refuses_bad_input(tmp_path, args, message):
    where = "--out" if args[0] == "run" else "--dir"
    proc = bench("bench.learning", *args, where, str(tmp_path), timeout=60)
    assert proc.returncode != 0
    assert message in proc.stderr, proc.stderr


def test_learning_arm_commands(tmp_path):
    from bench import learning

    a = argparse.Namespace(
        env="Ant-v5",
        steps=3000,
        policy="auto:256:128:64:auto",
        config=None,
        ours_args="--lr 3e-4",
        max_wall_s=60.0,
        peer_device="cpu",
        peer_envs=2,
        peer_rollout=1024,
    )
    result = tmp_path / "Ant-v5-x-seed1.result.json"
    for arm, module in (("sb3", "bench.peers.sb3_ppo"), ("cleanrl", "bench.peers.cleanrl_ppo")):
        cmd = learning.run_command(arm, 1, 3, a, tmp_path / "p.jsonl", result)
        assert cmd[2] == module and cmd[cmd.index("--num-envs") + 1] == "2"
        assert cmd[cmd.index("--net") + 1] == "256,128,64" and "--seconds" in cmd
        assert cmd[cmd.index("--rollout") + 1] == "1024"
        assert ("--checkpoint" in cmd) == (arm == "sb3")  # cleanrl cannot resume
    cmd = learning.run_command("ours", 1, 3, a, tmp_path / "p.jsonl", result)
    assert cmd[cmd.index("--actors") + 1] == "3" and cmd[-2:] == ["--lr", "3e-4"]
    assert cmd[cmd.index("--checkpoint") + 1] == str(tmp_path / "Ant-v5-x-seed1.checkpoint")


def test_core_slices_leave_no_core_idle(monkeypatch):
    from bench import learning

    monkeypatch.setattr(learning.os, "sched_getaffinity", lambda pid: set(range(16)))
    slices = learning.core_slices(6)
    assert [len(s) for s in slices] == [3, 3, 3, 3, 2, 2]
    assert sorted(c for s in slices for c in s) == list(range(16))
