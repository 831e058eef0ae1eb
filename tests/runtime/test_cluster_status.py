"""``autotune status`` for a tuned run whose actors are on a Ray cluster's nodes (a local
multi-node cluster): the nodes it lists, and the actors the tuner adds and removes there."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

from runtime.cluster import cluster_cpus

pytest.importorskip("ray")


@pytest.mark.slow
def test_a_tuned_cluster_run_shows_its_nodes_in_status_and_loses_nothing(tmp_path):
    """A run with its actors on two local Ray nodes, tuned by the daemon over the actor count:
    ``autotune status`` lists the nodes and the actors on each; the actors the tuner adds and
    removes between trials deliver everything (nothing lost)."""
    from conftest import kill_daemon, wait_until

    env = {**os.environ, "AUTOTUNE_HOME": str(tmp_path / "h"), "AUTOTUNE_CONTROL": ""}
    env["COLUMNS"] = "200"
    cli = [sys.executable, "-m", "autotune.cli"]
    started = subprocess.run([*cli, "daemon", "start"], env=env, capture_output=True, text=True)
    assert started.returncode == 0, started.stderr
    db = tmp_path / "s.db"
    job = subprocess.Popen(
        [
            *(*cli, "train", "--env", "CartPole-v1", "--tune", "--quiet", "--cluster", "local:2"),
            *("--storage", f"sqlite:///{db}", "--study", "nodes", "--steps", "10000000"),
            *("--tune-window-s", "1", "--tune-window-max-s", "2", "--tune-warmup-s", "0.5"),
            *("--knob", "actors=1..2", "--knob", "envs_per_actor=4", "--knob", "trainers=1"),
            *("--knob", "trainer_threads=1", "--knob", "batch_size=512,1024"),
            *("--envs-per-actor", "4", "--batch-size", "512", "--trainers", "1"),  # no probes
            *("--trainer-device", "cpu", "--tune-sampler", "tpe", "--max-wall-s", "900"),
            *("--json", str(tmp_path / "r.json")),
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    status: dict = {}

    def nodes_shown() -> bool:
        out = subprocess.run(
            [*cli, "status", "--json", str(tmp_path / "st.json")], env=env, capture_output=True
        )
        if out.returncode != 0 or not (tmp_path / "st.json").exists():
            return False
        status.update(json.loads((tmp_path / "st.json").read_text()))
        jobs = status.get("jobs") or [{}]
        nodes = jobs[0].get("nodes") or []
        return sum(n["actors"] for n in nodes) >= 1 and len(jobs[0].get("trials", [])) >= 3

    early = None
    try:
        wait_until(nodes_shown, job, what="the job's nodes and 3 trials in status")
        text = subprocess.run([*cli, "status"], env=env, capture_output=True, text=True).stdout
    except AssertionError as exc:
        early = exc
    finally:
        if job.poll() is None:
            job.send_signal(signal.SIGINT)
        out, _ = job.communicate(timeout=180)
        kill_daemon(env["AUTOTUNE_HOME"])
    assert early is None, f"{early}; the job said:\n{out[-3000:]}"  # why it ended early
    assert job.returncode == 0, out[-3000:]
    nodes = status["jobs"][0]["nodes"]
    assert len(nodes) == 3 and sum(n["cpus"] for n in nodes) == cluster_cpus("local:2")[0]
    assert not any(n["lost"] for n in nodes)
    assert "cluster nodes" in text and nodes[0]["node"] in text
    r = json.loads((tmp_path / "r.json").read_text())
    assert r["lost_steps"] == 0
    assert r["sampled_steps"] == r["env_steps"] + r["discarded_steps"] + r["lost_steps"]
