"""Every benchmark script runs end to end on the CPU with a tiny budget (the figures are not
checked here; they belong in docs/BENCHMARKS.md, measured on the device machines)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow


def run(tmp_path, *args: str) -> dict:
    out = tmp_path / "out.json"
    proc = subprocess.run(
        [sys.executable, "-m", *args, "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(out.read_text())


def test_pipeline_throughput_smoke(tmp_path):
    doc = run(
        tmp_path,
        "bench.pipeline_throughput",
        "--seconds",
        "0.3",
        "--sizes",
        "cartpole-like",
        "--producers",
        "1",
    )
    modes = {r["mode"]: r for r in doc["rows"]}
    assert set(modes) == {"raw", "per-rollout", "stages-1", "stages"}
    assert all(r["rollouts"] > 0 for r in modes.values())


def test_end_to_end_smoke(tmp_path):
    doc = run(
        tmp_path,
        "bench.end_to_end",
        "--actors",
        "1",
        "--envs-per-actor",
        "2",
        "--steps",
        "2048",
        "--batch-size",
        "512",
        "--raw-seconds",
        "0.5",
        "--policy",
        "auto",
    )
    assert doc["raw_steps_per_s"] > 0 and doc["result"]["env_steps"] >= 2048
    assert doc["result"]["lost_steps"] == 0


def test_grad_sync_smoke_with_gloo(tmp_path):
    doc = run(
        tmp_path,
        "bench.grad_sync",
        "--gpus",
        "2",
        "--gmis-per-gpu",
        "1",
        "--steps",
        "2",
        "--batch",
        "16",
        "--policy",
        "8:16:4",
        "--inter-backend",
        "gloo",
    )
    assert doc["algorithm1_choice"] == "multi-ring-reduction"
    assert all(r["identical_weights"] for r in doc["results"].values())


def test_gmi_table_smoke_on_cpu(tmp_path):
    doc = run(
        tmp_path,
        "bench.gmi_table",
        "--env",
        "CartPole-v1",
        "--policy",
        "auto",
        "--actors",
        "1",
        "--devices",
        "cpu",
        "--gmis",
        "2",
        "--envs-per-actor",
        "4",
        "--batch-size",
        "256",
        "--rollout-len",
        "16",
        "--warmup-s",
        "0.5",
        "--measure-s",
        "1",
        "--inference",
        "gmi",
    )
    assert [(r["gmis"], r["inference"]) for r in doc["rows"]] == [(2, "gmi")]
    assert all(r["rows_per_batch"] > 0 for r in doc["rows"])
    for row in doc["rows"]:
        assert "error" not in row, row
        assert row["lost_steps"] == 0 and row["weights_identical"]
        assert row["sampled_per_s"] > 0 and row["cpu_source"] == "model"


def test_online_tuning_smoke_on_cpu(tmp_path):
    """Every arm of bench.online_tuning as a tiny CartPole run, then the report and its plot.
    Training starts about 5 s into each run here (more on a loaded 2-core CI machine), so the
    tuned run lasts 20 s for its final third to hold trained steps, and the grid 11 s for one
    grid point after the baseline window (8 s left none once on a CI machine)."""
    knobs = [
        "--knob",
        "actors=1..2",
        "--knob",
        "envs_per_actor=4,8",
        "--knob",
        "trainers=1",
        "--knob",
        "batch_size=512,1024",
        "--knob",
        "trainer_threads=1",
        "--knob",
        "chunk_bytes=262144",
    ]
    common = [
        "--env",
        "CartPole-v1",
        "--storage",
        f"sqlite:///{tmp_path}/t.db",
        "--window-s",
        "1",
        "--warmup-s",
        "0.5",
        *knobs,
    ]
    # one tune part (a study resumed by a second part is the daemon and tuner tests' subject)
    for arm, seconds, name in (
        ("tune", "20", "tune1"),
        ("grid", "11", "grid"),
        ("default", "6", "default"),
    ):
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "bench.online_tuning",
                arm,
                *common,
                "--seconds",
                seconds,
                "--out",
                str(tmp_path / f"{name}.json"),
            ],
            capture_output=True,
            text=True,
            timeout=240,
        )
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    doc = run(
        tmp_path,
        "bench.online_tuning",
        "report",
        "--dir",
        str(tmp_path),
        "--skip-s",
        "1",
        "--plot",
        str(tmp_path / "tuning.png"),
    )
    assert doc["lost_steps"] == [0, 0, 0]
    assert doc["tuned_trials"] >= 2 and doc["grid_points"] >= 1
    assert doc["tuned_final_third_steps_per_joule"] > 0 and doc["default"]["steps_per_joule"] > 0
    assert (tmp_path / "tuning.png").stat().st_size > 10_000


def test_actor_inference_smoke(tmp_path):
    doc = run(
        tmp_path,
        "bench.actor_inference",
        "--envs",
        "4",
        "--calls",
        "5",
        "--repeats",
        "1",
        "--obs",
        "4",
        "--act",
        "2",
        "--discrete",
        "--policy",
        "auto:16:auto",
        "--import-repeats",
        "1",
    )
    (row,) = doc["rows"]
    assert row["envs"] == 4 and set(row["us_per_call"]) == {"torch", "numpy"}
    assert doc["import_s"]["numpy"] > 0 and doc["import_s"]["torch"] > 0
