"""A run reports its learner's gradient noise scale: in the result, its progress lines and the
summary table (``policies.noise_scale``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from autotune.workflows.progress_log import read_progress


def test_a_run_reports_its_gradient_noise_scale_and_the_efficiency_of_its_steps(tmp_path):
    out, progress = tmp_path / "r.json", tmp_path / "p.jsonl"
    proc = subprocess.run(
        [
            *(sys.executable, "-m", "autotune.cli", "train", "--env", "CartPole-v1"),
            *("--steps", "20000", "--actors", "1", "--envs-per-actor", "8"),
            *("--batch-size", "1024", "--trainer-device", "cpu", "--trainers", "1"),
            *("--json", str(out), "--progress", str(progress)),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "COLUMNS": "200"},
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    noise = json.loads(out.read_text())["noise_scale"]
    assert noise["samples"] > 0 and noise["minibatch_samples"] > 0
    expected = noise["samples"] / (noise["samples"] + noise["minibatch_samples"])
    assert abs(noise["efficiency"] - expected) < 1e-12 and 0 < noise["efficiency"] < 1
    rows = read_progress(progress)
    assert rows[-1]["noise_scale"] == noise["samples"]  # the final line: the result's figure
    assert "gradient noise scale" in proc.stdout
