"""``autotune train --target-return R``: the run stops at the first 100-episode mean of at
least R and says what it took; one that never gets there says so, with its best mean. The same
run reports its learner's gradient noise scale (``policies.noise_scale``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from autotune.workflows.progress_log import read_progress
from runtime.config import TrainConfig

SIZED = ("--actors", "1", "--envs-per-actor", "64", "--batch-size", "2048")
CPU = ("--trainer-device", "cpu", "--trainers", "1")


def _train(tmp_path, *flags: str) -> tuple[subprocess.CompletedProcess, dict]:
    out, progress = tmp_path / "r.json", tmp_path / "p.jsonl"
    proc = subprocess.run(
        [
            *(sys.executable, "-m", "autotune.cli", "train", "--env", "CartPole-v1"),
            *(*SIZED, *CPU, *flags, "--json", str(out), "--progress", str(progress)),
        ],
        capture_output=True,
        text=True,
        timeout=900,
        env={**os.environ, "COLUMNS": "200"},
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc, json.loads(out.read_text())


@pytest.mark.slow
def test_cartpole_stops_at_the_target_and_reports_the_joules_to_it(tmp_path):
    proc, r = _train(tmp_path, "--target-return", "450", "--steps", "2000000")
    t = r["target"]
    assert t["return"] == 450 and t["reached"] and 450 <= t["return_then"] <= t["best_return"]
    assert 0 < t["steps"] <= r["env_steps"] < 2_000_000  # stopped early; the drain trained on
    assert (
        0 < t["seconds"] <= r["wall_s"]
        and 0 < t["joules"] <= r["energy"]["gpu_j"] + r["energy"]["cpu_j"]
    )
    assert "to a return of 450" in proc.stdout
    # the learner's gradient noise scale: in the result, the progress lines and the summary
    noise = r["noise_scale"]
    # the run's batch, not the drain's last (smaller) update
    assert noise["samples"] > 0 and noise["batch_samples"] == r["config"]["batch_size"]
    expected = noise["samples"] / (noise["samples"] + noise["batch_samples"])
    assert abs(noise["efficiency"] - expected) < 1e-12 and 0 < noise["efficiency"] < 1
    assert read_progress(tmp_path / "p.jsonl")[-1]["noise_scale"] == noise["samples"]
    assert "gradient noise scale" in proc.stdout


def test_a_target_the_run_never_reaches_is_said_with_its_best_mean(tmp_path):
    proc, r = _train(tmp_path, "--target-return", "1000", "--steps", "6000")
    assert r["target"]["reached"] is False and r["target"]["return"] == 1000
    assert r["env_steps"] >= 6_000  # it ran to its step target
    assert "not reached (best 100-episode mean" in proc.stdout
    spent = r["target"]["spent"]  # what it cost without getting there: the run's own figures
    assert spent["steps"] == r["env_steps"] and spent["joules"] > 0 and spent["seconds"] > 0
    assert f"after {spent['steps']:,} steps" in proc.stdout


def test_a_target_that_is_not_a_number_is_refused():
    problems = TrainConfig(target_return=float("nan")).problems()
    assert any("target_return=nan: must be a finite number" in p for p in problems)
