"""Every suite runs end to end on the CPU with a tiny budget (the figures are not checked here;
they belong in docs/BENCHMARKS.md, measured on GPU machines)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow


def bench(*args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "bench", *args], capture_output=True, text=True, timeout=timeout
    )


def run(tmp_path, suite: str, *args: str) -> dict:
    """Runs ``python -m bench SUITE ARGS --out TMP`` and returns its document's results."""
    proc = bench(suite, *args, "--out", str(tmp_path))
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    doc = json.loads((tmp_path / f"{suite}.json").read_text())
    assert doc["suite"] == suite and doc["command"][3] == suite and "machine" in doc
    return doc["results"]


def test_pipeline_in_two_parts_runs_each_size_once(tmp_path):
    """Each size is a step of about 4 x (0.3 + 8) s: with --part-s 34 the first part has no
    room for the second size once the first has run, and the same command again runs it."""
    args = ["--seconds", "0.3", "--producers", "1", "--state", str(tmp_path / "st")]
    args += ["--part-s", "34", "--out", str(tmp_path)]
    first = bench("pipeline", *args)
    assert first.returncode == 0, first.stderr[-2000:]
    assert "1 steps left; run the same command again (left: ant-like)" in first.stdout
    second = bench("pipeline", *args)
    assert second.returncode == 0, second.stderr[-2000:]
    assert "cartpole-like: done in an earlier part, skipped" in second.stdout
    assert "ant-like: running" in second.stdout and "all steps done" in second.stdout
    assert second.stdout.count("| cartpole-like |") == 4  # the table of both parts' rows
    results = json.loads((tmp_path / "pipeline.json").read_text())["results"]
    assert list(results) == ["cartpole-like", "ant-like"]
    for size, result in results.items():
        modes = {r["mode"]: r for r in result["rows"]}
        assert set(modes) == {"raw", "per-rollout", "stages-1", "stages"}, size
        assert all(r["rollouts"] > 0 and r["size"] == size for r in modes.values())


def test_end_to_end_smoke(tmp_path):
    (doc,) = run(
        tmp_path,
        "end-to-end",
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
    ).values()
    assert doc["raw_steps_per_s"] > 0 and doc["result"]["env_steps"] >= 2048
    assert doc["result"]["lost_steps"] == 0


def test_grad_sync_smoke_with_gloo(tmp_path):
    doc = run(
        tmp_path,
        "gmi",
        "--only",
        "grad-sync",
        "--sync-gpus",
        "2",
        "--sync-gmis-per-gpu",
        "1",
        "--sync-steps",
        "2",
        "--sync-batch",
        "16",
        "--sync-policy",
        "8:16:4",
        "--inter-backend",
        "gloo",
    )["grad-sync"]
    assert doc["algorithm1_choice"] == "multi-ring-reduction"
    assert all(r["identical_weights"] for r in doc["results"].values())


def test_gmi_table_smoke_on_cpu(tmp_path):
    rows = run(
        tmp_path,
        "gmi",
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
    assert list(rows) == ["cpu-a1-g2-gmi"]
    assert [(r["gmis"], r["inference"]) for r in rows.values()] == [(2, "gmi")]
    assert all(r["rows_per_batch"] > 0 for r in rows.values())
    for row in rows.values():
        assert "error" not in row, row
        assert row["lost_steps"] == 0 and row["weights_identical"]
        assert row["sampled_per_s"] > 0 and row["cpu_source"] == "model"


def test_tuning_smoke_on_cpu(tmp_path):
    """Every online arm of the tuning suite as a tiny CartPole run, then the report and its
    plot, in one command. The arms wait on progress, not seconds: the tuned and grid runs go on
    until their studies hold two more measured trials (the grid's first is its baseline), the
    default run until it trained 4,000 steps after its first second; so a loaded machine gives
    longer runs, never empty ones."""
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
    # one tune part (a study resumed by a second part is the daemon and tuner tests' subject)
    doc = run(
        tmp_path,
        "tuning",
        "--env",
        "CartPole-v1",
        "--window-s",
        "1",
        "--window-max-s",
        "2",
        "--warmup-s",
        "0.5",
        *knobs,
        "--tune-s",
        "4",
        "--grid-s",
        "4",
        "--default-s",
        "3",
        "--min-trials",
        "2",
        "--min-steps",
        "4000",
        "--skip-s",
        "1",
        "--plot",
        str(tmp_path / "tuning.png"),
    )
    assert list(doc) == ["tune1", "grid", "default", "report"]
    assert all(doc[arm]["returncode"] == 0 for arm in ("tune1", "grid", "default"))
    assert (tmp_path / "tuning.db").is_file()  # the online study, under --out
    doc = doc["report"]
    assert doc["lost_steps"] == [0, 0, 0]
    assert doc["tuned_trials"] >= 2 and doc["grid_points"] >= 1
    assert doc["tuned_final_third_steps_per_joule"] > 0 and doc["default"]["steps_per_joule"] > 0
    assert (tmp_path / "tuning.png").stat().st_size > 10_000


def test_actor_inference_smoke(tmp_path):
    doc = run(
        tmp_path,
        "gmi",
        "--only",
        "actor-inference",
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
    )["actor-inference"]
    (row,) = doc["rows"]
    assert row["envs"] == 4 and set(row["us_per_call"]) == {"torch", "numpy"}
    assert doc["import_s"]["numpy"] > 0 and doc["import_s"]["torch"] > 0


def test_limits_raw_smoke(tmp_path):
    results = run(tmp_path, "limits", "--only", "raw", "--processes", "2", "--seconds", "0.5")
    assert list(results) == ["raw"]
    raw = results["raw"]
    assert raw["env"] == "CartPole-v1" and raw["processes"] == 2 and raw["steps_per_s"] > 0
    # each backend that has the env was measured, and the limit is the faster's
    assert "gymnasium" in raw["by_backend"] and raw["backend"] in raw["by_backend"]
    assert raw["steps_per_s"] == max(raw["by_backend"].values())


def test_backends_suite_measures_raw_stepping_a_sized_run_and_its_states_on_envpool(tmp_path):
    pytest.importorskip("envpool")
    results = run(
        tmp_path,
        "backends",
        "--envs",
        "CartPole-v1",
        "--backends",
        "envpool",
        "--raw-s",
        "0.5",
        "--processes",
        "2",
        "--train-s",
        "600",  # a cap only: the step ends at --train-steps, however slow its start-up
        "--train-steps",
        "3000",
        "--warmup-s",
        "0",
        "--markdown",
        str(tmp_path / "t.md"),
    )
    assert results["raw-CartPole-v1-envpool"]["steps_per_s"] > 0
    assert results["again-CartPole-v1-envpool"]["steps_per_s"] > 0  # raw once more, at the end
    probed = results["probe-CartPole-v1-envpool"]  # the sizing probe's loaded rounds
    assert probed["processes"] == 2 and probed["steps_per_s"] > 0
    run_doc = results["train-CartPole-v1-envpool"]
    assert run_doc["env_backend"] == "envpool" and run_doc["lost_steps"] == 0
    assert run_doc["window_steps_per_s"] > 0 and run_doc["config"]["actors"] >= 1
    # the actor's loop stepping with the run's final policy, beside raw stepping, on every core
    states = results["states-CartPole-v1-envpool"]
    assert states["policy_of"] == "train-CartPole-v1-envpool"
    assert states["envs_per_actor"] == run_doc["config"]["envs_per_actor"]
    assert states["collect"]["weights"].endswith("learner.pt")
    for loop in (states["raw"], states["collect"]):
        assert loop["processes"] == 2 and loop["steps_per_s"] > 0 and loop["episode_len"] > 0
    table = (tmp_path / "t.md").read_text()
    assert "| CartPole-v1 |" in table and "EnvPool train / its raw" in table
    assert "loaded probe EnvPool" in table and "collect with that run's policy" in table


def test_transport_suite_runs_one_config_on_ipc_and_on_tcp_with_curve(tmp_path):
    small = (
        "--actors 1 --envs-per-actor 4 --rollout-len 16 --batch-size 256 --trainer-device cpu "
        "--trainers 1"  # every sized value given: no probes
    )
    results = run(
        tmp_path,
        "transport",
        "--env",
        "CartPole-v1",
        "--policy",
        "auto",
        "--rounds",
        "1",
        "--train-s",
        "600",  # a cap only: each arm ends at --train-steps, however slow its start-up
        "--train-steps",
        "3000",
        "--warmup-s",
        "0",
        "--train-args",
        small,
        "--arms",
        "ipc,tcp,ray",
        "--markdown",
        str(tmp_path / "t.md"),
    )
    ipc, tcp, ray = results["train-ipc-1"], results["train-tcp-1"], results["train-ray-1"]
    assert ipc["transport"] == "ipc" and tcp["transport"] == "tcp"
    for arm in (ipc, tcp):
        assert arm["window_steps_per_s"] > 0 and arm["lost_steps"] == 0
        assert arm["auth_refused"] == 0
        assert arm["config"]["actors"] == 1 and arm["config"]["batch_size"] == 256
    assert tcp["bind_host"] and tcp["bind_source"]
    assert ray["window_steps_per_s"] > 0 and ray["lost_steps"] == 0 and ray["auth_refused"] == 0
    assert ray["config"]["actors"] == 1 and ray["transport"].startswith("ray, 1 local node")
    assert sum(n["actors"] for n in ray["energy_nodes"].values()) == 1
    table = (tmp_path / "t.md").read_text()
    assert "tcp / ipc trained steps/s" in table and "| train-tcp-1 | tcp on " in table
    assert "ray / ipc trained steps/s" in table
