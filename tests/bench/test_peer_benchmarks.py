"""bench.compare and bench.learning end to end on the CPU with tiny budgets (the figures belong in
docs/BENCHMARKS.md, measured on the device machine), and their refusals of bad input."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from autotune.progress_log import read_progress


def bench(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", *args], capture_output=True, text=True,
                          timeout=timeout)  # fmt: skip


def config(path, **fields) -> str:
    doc = {"env": "Pendulum-v1", "actors": 1, "envs_per_actor": 4, "batch_size": 512,
           "trainer_device": "cpu", **fields}  # fmt: skip
    path.write_text(json.dumps(doc))
    return str(path)


@pytest.mark.slow
def test_compare_every_arm_then_report(tmp_path):
    """Every arm, a labelled second exported config, and the report's table, goals and plots."""
    out = tmp_path / "run"
    knobs = ["--knob", "actors=1", "--knob", "envs_per_actor=2,4", "--knob", "trainers=1",
             "--knob", "batch_size=512", "--knob", "trainer_threads=1",
             "--knob", "chunk_bytes=262144", "--knob", "inference=actor",
             "--knob", "rollout_len=32", "--knob", "trainer_device=cpu"]  # fmt: skip
    proc = bench("bench.compare", "run", "--env", "Pendulum-v1", "--policy", "auto:32:auto",
                 "--seconds", "5", "--startup-s", "4", "--tuned-s", "24", "--warmup-s", "1",
                 "--settle-s", "0", "--arms", "limit,sb3-cpu,cleanrl,default,exported,tuned",
                 "--exported", config(tmp_path / "a.json"),
                 "--exported", "two=" + config(tmp_path / "b.json", envs_per_actor=8),
                 *knobs, "--out", str(out))  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    docs = [p for p in out.glob("Pendulum-v1-*.json") if not p.name.endswith(".result.json")]
    arms = {p.stem.split("-", 2)[-1]: json.loads(p.read_text()) for p in docs}
    assert set(arms) == {"limit", "sb3-cpu", "cleanrl", "default", "exported", "exported-two",
                         "tuned"}  # fmt: skip
    for name, doc in arms.items():
        assert "error" not in doc, (name, doc)
        assert doc["steps_per_s"] > 0 and doc["steps_per_joule"] > 0, name
        assert doc["cpu"] in ("rapl", "model"), name
        curve = read_progress(out / f"Pendulum-v1-{name}.progress.jsonl")
        steps = [r["steps"] for r in curve]
        assert steps == sorted(steps) and steps[-1] > 0, name
    assert arms["exported-two"]["config"]["envs_per_actor"] == 8
    assert arms["exported"]["config"]["envs_per_actor"] == 4
    for name in ("default", "exported", "exported-two", "tuned"):
        assert arms[name]["lost_steps"] == 0, name
    md, plots = tmp_path / "table.md", tmp_path / "plots"
    proc = bench("bench.compare", "report", "--dir", str(tmp_path), "--markdown", str(md),
                 "--plots", str(plots))  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    goals = json.loads(proc.stdout)
    (group,) = goals.values()
    assert set(group) == {"trained steps/s vs limit", "steps/J vs SB3 best", "steps/J vs limit"}
    assert all(g["ratio"] > 0 and isinstance(g["met"], bool) for g in group.values())
    text = md.read_text()
    assert "| exported-two |" in text and "| limit | " in text and "goal >= 7.0" in text
    (png,) = plots.glob("*.png")
    assert png.stat().st_size > 10_000


@pytest.mark.slow
def test_learning_runs_resume_and_report(tmp_path):
    """Every arm and two seeds on two core slices; then an sb3 run stopped by --max-wall-s and
    resumed from its checkpoint by the same command; then the report at two step counts."""
    out = tmp_path / "learn"
    common = ["bench.learning", "run", "--env", "Pendulum-v1", "--policy", "auto:32:auto",
              "--out", str(out)]  # fmt: skip
    ours = "--batch-size 512 --envs-per-actor 4"
    proc = bench(*common, "--arms", "ours,sb3,cleanrl", "--seeds", "0,1", "--steps", "4096",
                 "--parallel", "2", "--ours-args", ours)  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    for arm in ("ours", "sb3", "cleanrl"):
        for seed in (0, 1):
            doc = json.loads((out / f"Pendulum-v1-{arm}-seed{seed}.json").read_text())
            assert doc["finished"] and doc["trained_steps"] >= 4096, doc
    long = [*common, "--arms", "sb3", "--seeds", "7", "--steps", "30000"]
    proc = bench(*long, "--max-wall-s", "3")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    first = json.loads((out / "Pendulum-v1-sb3-seed7.json").read_text())
    assert not first["finished"] and 0 < first["trained_steps"] < 30000
    assert (out / "Pendulum-v1-sb3-seed7.checkpoint" / "model.zip").is_file()
    proc = bench(*long)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    log = (out / "Pendulum-v1-sb3-seed7.log").read_text()
    assert f"resumed from {out / 'Pendulum-v1-sb3-seed7.checkpoint'} at" in log
    second = json.loads((out / "Pendulum-v1-sb3-seed7.json").read_text())
    assert second["finished"]
    steps = [r["steps"] for r in read_progress(out / "Pendulum-v1-sb3-seed7.progress.jsonl")]
    assert steps == sorted(steps) and steps[0] == 0 and steps[-1] >= 30000
    proc = bench(*long)  # finished runs are skipped
    assert "already at 30000 steps, skipped" in proc.stdout
    md = tmp_path / "t.md"
    proc = bench("bench.learning", "report", "--dir", str(out), "--at", "2048,4096", "--markdown",
                 str(md), "--plot", str(tmp_path / "r.png"))  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = {r["arm"]: r for r in json.loads(proc.stdout)}
    assert rows["ours"]["4096"]["n"] == 2 and rows["cleanrl"]["2048"]["n"] == 2
    assert rows["sb3"]["seeds"] == [0, 1, 7] and rows["sb3"]["4096"]["n"] == 3
    assert "| Pendulum-v1 | ours | 2 |" in md.read_text()
    assert (tmp_path / "r.png").stat().st_size > 10_000


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--arms", "limit,sb3"], "--arms: unknown ['sb3']; allowed limit, sb3-cpu"),
        (["--arms", "exported"], "the exported arm needs --exported FILE"),
        (["--arms", "exported", "--exported", "x y=a.json"], "a label is letters, digits"),
        (["--arms", "exported", "--exported", "nothing.json"], "no such file 'nothing.json'"),
        (["--seconds", "0"], "--seconds and --tuned-s must be > 0"),
    ],
)
def test_compare_refuses_bad_input(tmp_path, args, message):
    proc = bench("bench.compare", "run", *args, "--out", str(tmp_path / "o"), timeout=60)
    assert proc.returncode == 2 or proc.returncode == 1
    assert message in proc.stderr, proc.stderr


def test_compare_exported_twice_refused(tmp_path):
    cfg = config(tmp_path / "a.json")
    proc = bench("bench.compare", "run", "--arms", "exported", "--exported", cfg, "--exported",
                 cfg, "--out", str(tmp_path / "o"), timeout=60)  # fmt: skip
    assert "the arm 'exported' is given twice" in proc.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["run", "--arms", "ours,zoo"], "--arms: unknown ['zoo']"),
        (["run", "--seeds", "a,b"], "--seeds 'a,b': expected integers"),
        (["run", "--parallel", "999"], "--parallel 999: more runs at once"),
        (["run", "--max-wall-s", "-1"], "--max-wall-s >= 0"),
        (["report"], "no `bench.learning run` results under"),
        (["report", "--at", "x"], "--at 'x': expected step counts"),
    ],
)
def test_learning_refuses_bad_input(tmp_path, args, message):
    where = "--out" if args[0] == "run" else "--dir"
    proc = bench("bench.learning", *args, where, str(tmp_path), timeout=60)
    assert proc.returncode != 0
    assert message in proc.stderr, proc.stderr
