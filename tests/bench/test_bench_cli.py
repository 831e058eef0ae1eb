"""``python -m bench``: its suites, its refusals, and steps that run in parts and resume."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

import pytest

from bench import suite
from bench.__main__ import SUITES
from bench.suite import NotFinished, Step, run_suite


def bench(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "bench", *args], capture_output=True, text=True, timeout=timeout
    )


def test_help_lists_the_ten_suites_each_with_one_line():
    proc = bench("--help")
    assert proc.returncode == 0, proc.stderr
    assert SUITES == (
        "limits",
        "pipeline",
        "end-to-end",
        "tuning",
        "learning",
        "peers",
        "gmi",
        "faults",
        "sharing",
        "backends",
        "transport",
        "goodput",
    )
    text = proc.stdout
    for name in SUITES:
        assert f"    {name}" in text, (name, text)
    assert "steps/J" in text and "Stable-Baselines3" in text and "MPS" in text
    assert "    figures   draws the page's plots from the stored results" in text
    proc = bench("figures", "--help")
    assert proc.returncode == 0, proc.stderr
    assert "usage: python -m bench figures" in proc.stdout and "--results DIR" in proc.stdout
    for name in SUITES:
        proc = bench(name, "--help")
        assert proc.returncode == 0, (name, proc.stderr)
        assert f"usage: python -m bench {name}" in proc.stdout
        assert "--out DIR" in proc.stdout and "--part-s N" in proc.stdout, name


def test_a_bad_suite_or_flag_says_what_is_allowed():
    proc = bench("limit")
    assert proc.returncode == 2
    assert "unknown suite 'limit'; the suites are: limits, pipeline, end-to-end" in proc.stderr
    proc = bench("limits", "--sconds", "3")
    assert proc.returncode == 2
    assert "unrecognized arguments: --sconds 3; the flags of limits are" in proc.stderr
    assert "--seconds" in proc.stderr and "--idle-s" in proc.stderr
    proc = bench("gmi", "--only", "tables")
    assert proc.returncode == 2
    assert "--only: unknown ['tables']; allowed table, grad-sync, actor-inference" in proc.stderr
    proc = bench("pipeline", "--part-s", "10")
    assert proc.returncode != 0 and "--part-s N needs --state DIR" in proc.stderr


def _namespace(tmp_path, part_s: float = 0.0, state: bool = True) -> argparse.Namespace:
    return argparse.Namespace(
        out=str(tmp_path / "out"), state=str(tmp_path / "st") if state else None, part_s=part_s
    )


class Clock:
    """A clock the steps move forward, so that parts end where the test says."""

    def __init__(self) -> None:
        self.t = 1000.0

    def monotonic(self) -> float:
        return self.t


def _steps(clock: Clock, runs: list[str], took: dict[str, float]) -> list[Step]:
    def make(name: str):
        def run() -> dict:
            runs.append(name)
            clock.t += took[name]
            return {"name": name}

        return run

    return [Step(n, make(n), estimate_s=took[n]) for n in took]


def test_a_suite_in_parts_runs_each_step_once(tmp_path, monkeypatch, capsys):
    clock = Clock()
    monkeypatch.setattr(suite.time, "monotonic", clock.monotonic)
    took = {"a": 40.0, "b": 30.0, "c": 50.0, "d": 10.0}
    runs: list[str] = []
    argv = ["--seconds", "3"]
    a = _namespace(tmp_path, part_s=100)
    # part 1: a (40) and b (30) fit in 100 s; c (50) would end at 120: left for the next part
    assert run_suite("demo", _steps(clock, runs, took), a, argv) == 0
    assert runs == ["a", "b"]
    assert "2 steps left; run the same command again (left: c, d)" in capsys.readouterr().out
    doc = json.loads((tmp_path / "out" / "demo.json").read_text())
    assert doc["suite"] == "demo" and list(doc["results"]) == ["a", "b"]
    assert doc["command"] == ["python", "-m", "bench", "demo", *argv]
    assert doc["machine"]["cores"] >= 1 and doc["date"]
    # part 2: a and b are skipped, c and d run
    assert run_suite("demo", _steps(clock, runs, took), a, argv) == 0
    assert runs == ["a", "b", "c", "d"]
    out = capsys.readouterr().out
    assert "a: done in an earlier part, skipped" in out and "all steps done" in out
    doc = json.loads((tmp_path / "out" / "demo.json").read_text())
    assert doc["results"] == {n: {"name": n} for n in took}
    # part 3: nothing left to run
    assert run_suite("demo", _steps(clock, runs, took), a, argv) == 0
    assert runs == ["a", "b", "c", "d"]


def test_a_step_longer_than_a_part_is_refused(tmp_path):
    clock = Clock()
    steps = _steps(clock, [], {"long": 200.0})
    with pytest.raises(SystemExit, match=r"step long takes about 200 s, more than --part-s 100"):
        run_suite("demo", steps, _namespace(tmp_path, part_s=100), [])


def test_a_state_dir_of_another_command_is_refused(tmp_path):
    clock = Clock()
    a = _namespace(tmp_path)
    assert run_suite("demo", _steps(clock, [], {"a": 1.0}), a, ["--seconds", "3"]) == 0
    # --part-s and --state do not make another command; any other flag does
    a.part_s = 50
    argv = ["--seconds", "3", "--part-s", "50", "--state", a.state]
    assert run_suite("demo", _steps(clock, [], {"a": 1.0}), a, argv) == 0
    with pytest.raises(SystemExit, match=r"it belongs to another command \(demo --seconds 3\)"):
        run_suite("demo", _steps(clock, [], {"a": 1.0}), a, ["--seconds", "4"])
    with pytest.raises(SystemExit, match="give a fresh --state"):
        run_suite("other", _steps(clock, [], {"a": 1.0}), a, ["--seconds", "3"])


def test_an_unfinished_step_runs_again_and_a_failed_one_exits_1(tmp_path, capsys):
    calls = []

    def unfinished() -> dict:
        calls.append("u")
        if len(calls) == 1:
            raise NotFinished({"at": 1}, "not yet at its steps")
        return {"at": 2}

    steps = [Step("u", unfinished, 1.0), Step("f", lambda: {"failed": True}, 1.0)]
    a = _namespace(tmp_path)
    assert run_suite("demo", steps, a, []) == 0
    out = capsys.readouterr().out
    assert "step u stopped before its end (not yet at its steps). 2 steps left" in out
    assert not (tmp_path / "st" / "steps" / "u.json").exists()
    assert run_suite("demo", steps, a, []) == 1  # u goes on and ends; f failed
    assert calls == ["u", "u"]
    out = capsys.readouterr().out
    assert "failed steps: f" in out


def test_gpu_steps_are_skipped_saying_why_without_a_gpu(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(suite, "gpu_missing", lambda: "no GPU that NVML can read (test)")
    ran = []
    steps = [
        Step("cpu", lambda: ran.append("cpu") or {}, 1.0),
        Step("gpu", lambda: ran.append("gpu") or {}, 1.0, needs_gpu=True),
    ]
    assert run_suite("demo", steps, _namespace(tmp_path, state=False), []) == 0
    assert ran == ["cpu"]
    out = capsys.readouterr().out
    assert "gpu: skipped, it needs a GPU: no GPU that NVML can read (test)" in out
    assert "all steps done; skipped without a GPU: gpu" in out
