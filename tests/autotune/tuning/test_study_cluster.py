"""``autotune study --workers N --cluster ADDRESS``: the workers as Ray tasks on a local
multi-node Ray cluster, against one study storage; and the settings it refuses."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from autotune.workflows.study import StudyOptions, resolve_options


def _study(*flags: str, timeout_s: float = 600) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "autotune.cli.main", "study", "--env", "CartPole-v1", *flags]
    env = {**os.environ, "COLUMNS": "200"}
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, env=env)


@pytest.mark.parametrize(
    ("changes", "says"),
    [
        ({"cluster": "ray://10.0.0.5:10001", "worker_cpus": 2}, "cannot reach a SQLite file"),
        ({"cluster": "local:2"}, "give --worker-cpus K"),
        ({"cluster": "nowhere", "worker_cpus": 1}, "allowed auto, ray://HOST:PORT or local:N"),
        ({"worker_cpus": 2}, "take effect with --cluster only"),
        ({"cluster": "local:2", "worker_cpus": 1, "worker_gpus": 2}, "GPUs 0 or 1"),
    ],
)
def test_cluster_settings_that_cannot_work_are_refused_saying_why(changes, says):
    with pytest.raises(ValueError, match=says):
        resolve_options(StudyOptions(trials=4, workers=2, **changes))


def test_the_cli_refuses_a_sqlite_study_on_a_cluster_of_other_hosts():
    out = _study("--cluster", "auto", "--worker-cpus", "1", "--storage", "sqlite:///x.db")
    assert out.returncode == 2 and "cannot reach a SQLite file" in out.stderr


SCRIPT = Path(__file__).parents[2] / "fixtures" / "scripts" / "reporting.py"
"""A wrapped script that reports three steps (``tests/fixtures/scripts``)."""


@pytest.mark.slow
def test_two_workers_run_as_ray_tasks_on_two_nodes_into_one_study(tmp_path):
    """Two workers of one CPU each, as Ray tasks on a two-node local cluster, run a wrapped
    script's trials into one study; every trial comes back to the command, from both."""
    pytest.importorskip("ray")
    script = SCRIPT
    out = _study(
        *("--trials", "4", "--workers", "2", "--cluster", "local:2", "--worker-cpus", "1"),
        *("--knob", "num_envs=1,2,4", "--trial-s", "120", "--warmup-s", "0"),
        *("--storage", f"sqlite:///{tmp_path}/c.db", "--json", str(tmp_path / "c.json")),
        *("--", sys.executable, str(script)),
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "cluster local:2: 3 nodes; 2 workers of 1 CPUs each" in out.stderr
    doc = json.loads((tmp_path / "c.json").read_text())
    assert len(doc["trials"]) == 4 and {r["worker"] for r in doc["trials"]} == {0, 1}
    assert all(r["error"] is None and r["steps_per_s"] > 0 for r in doc["trials"])
    assert doc["best"] is not None
