"""The peers suite (``python -m bench peers``) end to end on the CPU with tiny budgets (the figures
belong in docs/BENCHMARKS.md, measured on a GPU machine), its arms' command lines, its report of
stored results, and its refusals of bad input."""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from autotune.workflows.progress_log import read_progress
from bench import compare, compare_arms
from bench.__main__ import main as bench_main


def bench(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "bench", *args], capture_output=True, text=True, timeout=timeout
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
        "peers",
        "--only",
        "arms",
        "--env",
        "Pendulum-v1",
        "--policy",
        "auto:32:auto",
        "--seconds",
        "3",  # the figures are not checked here: each arm only has to be measured
        "--startup-s",
        "6",
        "--warmup-s",
        "1",
        "--settle-s",
        "0",
        "--peer-rollout",
        "256",
        "--min-steps",
        "1500",  # each arm runs on until it trained that much: a loaded machine waits, not fails
        "--arms",
        "limit,sb3-cpu,cleanrl,exported",
        "--exported",
        config(tmp_path / "a.json"),
        "--out",
        str(out),
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    suite_doc = json.loads((out / "peers.json").read_text())
    assert list(suite_doc["results"]) == [
        f"Pendulum-v1/{a}" for a in ("limit", "sb3-cpu", "cleanrl", "exported")
    ]
    out = out / "Pendulum-v1"  # the arms' files, one directory per env
    assert json.loads((out / "machine.json").read_text())["cores"] >= 1
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
    assert arms["exported"]["actor_time"]["cpu_us_per_step"] > 0  # where the actors' time went
    assert arms["exported"]["cpu_time"]["trainers"] > 0  # and every process's CPU
    assert 0.0 <= arms["exported"]["window_throttle"] <= 1.0  # their waits inside the window
    md, plots = tmp_path / "table.md", tmp_path / "plots"
    proc = bench(
        "peers",
        "--only",
        "report",
        "--out",
        str(tmp_path),
        "--markdown",
        str(md),
        "--plots",
        str(plots),
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    goals = json.loads((tmp_path / "peers.json").read_text())["results"]["report"]
    (group,) = goals.values()
    assert set(group) == {"trained steps/s vs limit", "steps/J vs SB3 best", "steps/J vs limit"}
    assert all(g["ratio"] > 0 and isinstance(g["met"], bool) for g in group.values())
    text = md.read_text()
    assert "| exported |" in text and "| limit | " in text and "goal >= 7.0" in text
    assert re.search(r"- exported: actors \d+, stages \d+, trainers \d+, runner \d+ of", text)
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
    # tests/cli), with the arm's wall budget, time for its probes, and the shared policy
    cmd = compare_arms.arm_command("default", a, tmp_path / "p.jsonl", tmp_path / "r.json")
    assert cmd[2:4] == ["autotune.cli", "train"] and "--config" not in cmd
    assert cmd[cmd.index("--env") + 1] == "Pendulum-v1"
    assert cmd[cmd.index("--policy") + 1] == "auto:32:auto"
    assert float(cmd[cmd.index("--max-wall-s") + 1]) == 9.0 + compare_arms.SIZING_S


def test_report_of_the_stored_h100_cpu_trainer_run_keeps_its_figures(tmp_path):
    """The report on a GPU machine's stored results (H100 80GB, 16-core host: a labelled
    exported arm beside the limit and the cuda export) gives the figures docs/BENCHMARKS.md
    quotes."""
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
        bench_main(["peers", "--arms", "default", "--limit-again", "--out", str(tmp_path)])


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


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--arms", "limit,sb3"], "--arms: unknown ['sb3']; allowed limit, learner, sb3-cpu"),
        (["--arms", "exported"], "the exported arm needs --exported FILE"),
        (["--arms", "exported", "--exported", "x y=a.json"], "a label is letters, digits"),
        (["--arms", "exported", "--exported", "nothing.json"], "no such file 'nothing.json'"),
        (["--seconds", "0"], "--seconds, --tuned-s and --states-s must be > 0"),
        (["--peer-rollout", "0"], "--peer-rollout >= 1"),
        (["--states-s", "0"], "--states-s must be > 0"),
        (["--arms", "states,default"], "states steps the default arm's final policy; list def"),
        (["--arms", "limit,states"], "states steps the default arm's final policy; list def"),
    ],
)
def test_compare_refuses_bad_input(tmp_path, args, message):
    proc = bench("peers", *args, "--out", str(tmp_path / "o"), timeout=60)
    assert proc.returncode == 2 or proc.returncode == 1
    assert message in proc.stderr, proc.stderr


def test_compare_exported_twice_refused(tmp_path):
    cfg = config(tmp_path / "a.json")
    proc = bench(
        "peers",
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


def _plan(argv: list[str]):
    """The peers suite's steps and arm namespaces for ``argv`` (nothing is run)."""
    from bench.__main__ import parser
    from bench.suites import peers

    ap = parser()
    a = ap.parse_args(["peers", *argv])
    peers.check(a._parser, a)
    return a, peers.plan(a)[0], peers._runs(a)


def test_workloads_rounds_and_own_exports_make_the_steps(tmp_path):
    """Each workload's arms, each round between its own two limits, a workload's own export
    beside the shared one where the directory holds one."""
    (tmp_path / "humanoid-export.json").write_text("{}")
    shared = config(tmp_path / "a.json")
    argv = ["--workloads", "humanoid,ant-heavy", "--rounds", "2", "--arms", "limit,exported"]
    argv += ["--own-exports", str(tmp_path), "--exported", shared, "--limit-again"]
    argv += ["--seconds", "20", "--warmup-s", "8", "--out", str(tmp_path / "o")]
    _, steps, runs = _plan(argv)
    names = [s.name for s in steps]
    assert names == [
        *(
            f"humanoid/round{k}/{arm}"
            for k in (1, 2)
            for arm in ("limit", "exported", "exported-own", "limit-end")
        ),
        *(
            f"ant-heavy/round{k}/{arm}"
            for k in (1, 2)
            for arm in ("limit", "exported", "limit-end")
        ),
        "report",
    ]
    assert [sub for sub, _ in runs] == [
        "humanoid/round1",
        "humanoid/round2",
        "ant-heavy/round1",
        "ant-heavy/round2",
    ]
    (_, humanoid), (_, heavy) = runs[0], runs[2]
    assert (humanoid.env, humanoid.policy) == ("Humanoid-v5", "auto:400:200:100:auto")
    assert (heavy.env, heavy.policy) == ("Ant-v5", "auto:1024:1024:512:auto")
    own = compare_arms.arm_command("exported-own", humanoid, tmp_path / "p", tmp_path / "r")
    assert own[own.index("--config") + 1] == str(tmp_path / "humanoid-export.json")
    assert "exported-own" not in heavy.exports
    cmd = compare_arms.arm_command("limit-end", heavy, tmp_path / "p", tmp_path / "r")
    assert cmd[2] == "bench.raw_env_rate" and cmd[cmd.index("--env") + 1] == "Ant-v5"


def test_a_labelled_export_beside_the_limit_on_the_cpu_trainer(tmp_path):
    cpu = config(tmp_path / "cpu.json")
    argv = ["--env", "Ant-v5", "--arms", "limit,exported", "--exported", f"cpu={cpu}"]
    _, steps, runs = _plan([*argv, "--limit-again", "--out", str(tmp_path)])
    assert [s.name for s in steps] == [
        "Ant-v5/limit",
        "Ant-v5/exported-cpu",
        "Ant-v5/limit-end",
        "report",
    ]
    cmd = compare_arms.arm_command("exported-cpu", runs[0][1], tmp_path / "p", tmp_path / "r")
    assert cmd[cmd.index("--config") + 1] == cpu


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--workloads", "walker"], "--workloads: unknown ['walker']; allowed ant, halfcheetah"),
        (["--rounds", "0"], "--rounds 0: a whole number >= 1"),
        (["--rounds", "two"], "argument --rounds: invalid int value: 'two'"),
        (["--only", "plots"], "--only: unknown ['plots']; allowed arms, report"),
    ],
)
def test_peers_refuses_bad_workloads_and_rounds(tmp_path, capsys, args, message):
    with pytest.raises(SystemExit) as exc:
        bench_main(["peers", *args, "--out", str(tmp_path)])
    assert exc.value.code == 2
    assert message in capsys.readouterr().err


def test_an_arms_caches_are_its_own_folder_whatever_the_callers_environment(tmp_path):
    base = {"PATH": "/bin", "TORCHINDUCTOR_CACHE_DIR": "/x/inductor", "TRITON_CACHE_DIR": "/x/t"}
    env = compare.cache_env(tmp_path / "c", base)
    assert env == {"PATH": "/bin", "AUTOTUNE_CACHE_DIR": str(tmp_path / "c")}
    assert base["TRITON_CACHE_DIR"] == "/x/t"  # the caller's own environment is left as it was
