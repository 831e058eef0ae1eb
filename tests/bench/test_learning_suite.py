"""The learning suite (``python -m bench learning``) on the CPU with tiny budgets: runs stopped
by --max-wall-s and resumed by the same command, the report, the arms' command lines, and its
refusals of bad input."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

import pytest

from autotune.workflows.progress_log import read_progress


def bench(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "bench", *args], capture_output=True, text=True, timeout=timeout
    )


@pytest.mark.slow
def test_learning_runs_resume_and_report(tmp_path, capsys):
    """sb3 and ours runs stopped by --max-wall-s and resumed from their checkpoints by the same
    command; then the report. (The cleanrl arm's command is checked below; the peer itself
    runs in the peers suite's test.)"""
    out = tmp_path / "learn"
    common = [
        "learning",
        "--only",
        "runs",
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
    # sb3: stopped by --max-wall-s (its --seconds start at its training), once it trained at
    # least 512 steps (--min-steps: a loaded machine makes the part longer), then resumed to the end
    long = [*common, "--arms", "sb3", "--seeds", "7", "--steps", "8192"]
    proc = bench(*long, "--max-wall-s", "2", "--min-steps", "512")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert "1 steps left; run the same command again (left: runs)" in proc.stdout
    first = json.loads((out / "Pendulum-v1-sb3-seed7.json").read_text())
    assert not first["finished"] and 512 <= first["trained_steps"] < 8192, first
    assert (out / "Pendulum-v1-sb3-seed7.checkpoint" / "model.zip").is_file()
    proc = bench(*long)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert json.loads((out / "Pendulum-v1-sb3-seed7.json").read_text())["finished"]
    log = (out / "Pendulum-v1-sb3-seed7.log").read_text()
    assert f"resumed from {out / 'Pendulum-v1-sb3-seed7.checkpoint'} at" in log
    from bench.__main__ import main  # finished runs are skipped (in this process: none starts)

    assert main(long) == 0
    assert "already at 8192 steps, skipped" in capsys.readouterr().out
    # ours: two parts of a run too long for either; the second goes on from the first. Each part
    # runs 2 s and on until it trained 2,048 steps (then Ctrl-C: it drains and saves)
    long = [*common, "--arms", "ours", "--seeds", "7", "--steps", "5000000", "--max-wall-s", "2"]
    long += ["--min-steps", "2048"]
    reached = []
    for _ in range(2):
        proc = bench(*long)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
        doc = json.loads((out / "Pendulum-v1-ours-seed7.json").read_text())
        assert not doc["finished"] and doc["trained_steps"] >= (reached or [0])[-1] + 2048, doc
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
        "learning",
        "--only",
        "report",
        "--out",
        str(out),
        "--at",
        "2048,4096",
        "--markdown",
        str(md),
        "--plot",
        str(tmp_path / "r.png"),
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads((out / "learning.json").read_text())["results"]["report"]
    rows = {r["arm"]: r for r in report}
    assert rows["ours"]["seeds"] == [7] and rows["ours"]["4096"]["n"] == 1
    assert rows["sb3"]["seeds"] == [7] and rows["sb3"]["4096"]["n"] == 1
    assert "| Pendulum-v1 | ours | 1 |" in md.read_text()
    assert (tmp_path / "r.png").stat().st_size > 10_000


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--arms", "ours,zoo"], "--arms: unknown ['zoo']"),
        (["--seeds", "a,b"], "--seeds 'a,b': expected integers"),
        (["--parallel", "999"], "--parallel 999: more runs at once"),
        (["--max-wall-s", "-1"], "--max-wall-s, --peer-envs and --min-steps must be >= 0"),
        (["--min-steps", "-1"], "--max-wall-s, --peer-envs and --min-steps must be >= 0"),
        (["--peer-rollout", "0"], "--peer-rollout must be >= 1"),
        (["--only", "report"], "no `python -m bench learning` results under"),
        (["--at", "x"], "--at 'x': expected step counts"),
        (["--max-wall-s", "60", "--state", "s", "--part-s", "100"], "more than --part-s 100"),
    ],
)
def test_learning_refuses_bad_input(tmp_path, args, message):
    args = [x if x != "s" else str(tmp_path / "s") for x in args]
    proc = bench("learning", *args, "--out", str(tmp_path), timeout=60)
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
        min_steps=0,
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
    assert cmd[cmd.index("--max-wall-s") + 1] == "60.0"
    a.min_steps = 5000  # the wall limit is then a safety net; the suite stops the run itself
    cmd = learning.run_command("ours", 1, 3, a, tmp_path / "p.jsonl", result)
    assert float(cmd[cmd.index("--max-wall-s") + 1]) > 60.0
    cmd = learning.run_command("sb3", 1, 3, a, tmp_path / "p.jsonl", result)
    assert cmd[cmd.index("--min-steps") + 1] == "5000"


def test_core_slices_leave_no_core_idle(monkeypatch):
    from bench import learning

    monkeypatch.setattr(learning.os, "sched_getaffinity", lambda pid: set(range(16)))
    slices = learning.core_slices(6)
    assert [len(s) for s in slices] == [3, 3, 3, 3, 2, 2]
    assert sorted(c for s in slices for c in s) == list(range(16))
