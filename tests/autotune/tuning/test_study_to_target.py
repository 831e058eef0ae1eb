"""``autotune study --objective joules_to_target --target-return R``: each trial runs until its
100-episode mean return reaches R, the study ranks configs by the joules that took (a config
that does not get there ranks last, with its best return), and ``autotune export`` recommends
the one with the fewest."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from autotune.tuning.reference import TARGET_METRIC
from autotune.tuning.trials import target_measured


def _cli(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "autotune.cli.main", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "COLUMNS": "200"},
    )


@pytest.mark.parametrize(
    "flags,says",
    [
        (["--objective", "joules_to_target"], "go together"),
        (["--target-return", "100"], "go together"),
        (
            ["--objective", "joules_to_target", "--target-return", "100", "--reference-every", "2"],
            "reference runs do not scale",
        ),
        (
            ["--objective", "goodput_per_joule", "--knob", "n=1,2", "--", "python", "x.py"],
            "train trials only",
        ),
    ],
)
def test_a_target_without_its_objective_or_with_references_is_refused(flags, says):
    from autotune.cli.main import build_parser
    from autotune.cli.study import study_options

    with pytest.raises(ValueError, match=says):
        study_options(build_parser().parse_args(["study", *flags]))


def test_a_run_short_of_the_target_scores_nothing_and_keeps_its_best_return():
    result = {
        "wall_s": 20.0,
        "env_steps": 40_000,
        "steps_per_joule": 50.0,
        "lost_steps": 0,
        "energy": {"gpu_w": 0.0, "cpu_w": 40.0, "cpu_source": "model"},
    }
    short = target_measured(
        {**result, "target": {"return": 450, "reached": False, "best_return": 120.0}}
    )
    assert short.attrs[TARGET_METRIC] == 0.0 and not short.attrs["reached"]
    assert short.attrs["best_return"] == 120.0 and short.attrs["joules_to_target"] is None
    reached = {"return": 450, "reached": True, "joules": 500.0, "seconds": 12.5, "steps": 30_000}
    there = target_measured({**result, "target": {**reached, "best_return": 460.0}})
    assert there.attrs[TARGET_METRIC] == pytest.approx(2000.0)  # 1e6 / 500 J
    assert there.steps_per_s == 2000.0 and there.attrs["steps_to_target"] == 30_000


@pytest.mark.slow
def test_a_cartpole_study_to_a_return_ranks_by_joules_and_export_recommends_the_fewest(tmp_path):
    storage = f"sqlite:///{tmp_path}/s.db"
    fixed = ["--knob", "actors=1", "--knob", "trainers=1", "--knob", "trainer_threads=1"]
    fixed += ["--knob", "trainer_device=cpu", "--knob", "envs_per_actor=16,64"]
    out = _cli(
        *("study", "--env", "CartPole-v1", "--storage", storage, *fixed),
        *("--knob", "batch_size=1024", "--no-profile", "--trials", "2", "--seed", "1"),
        *("--objective", "joules_to_target", "--target-return", "100"),
        *("--trial-s", "400", "--json", str(tmp_path / "s.json")),
    )
    assert out.returncode == 0, out.stderr[-3000:]
    doc = json.loads((tmp_path / "s.json").read_text())
    rows = [r for r in doc["trials"] if r["error"] is None]
    assert len(rows) == 2 and {r["values"]["envs_per_actor"] for r in rows} == {16, 64}
    for r in rows:
        a = r["attrs"]
        assert a["target_return"] == 100 and a["reached"], a  # CartPole gets to 100
        assert a["joules_to_target"] > 0 and a["steps_to_target"] > 0
        assert a[TARGET_METRIC] == pytest.approx(1e6 / a["joules_to_target"])
        assert "return 100 reached in" in out.stderr
    fewest = min(rows, key=lambda r: r["attrs"]["joules_to_target"])
    out = _cli(
        *("export", "--study", "study-CartPole-v1", "--storage", storage),
        *("--out", str(tmp_path / "e.json")),
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "J to return 100 (median of 1 trial(s), 1 reached it)" in out.stderr + out.stdout
    exported = json.loads((tmp_path / "e.json").read_text())
    assert exported["picked_by"] == TARGET_METRIC
    assert exported["recommended"]["values"]["envs_per_actor"] == fewest["values"]["envs_per_actor"]
    rec = exported["evidence"]["recommended"]
    assert rec["joules_to_target"]["median"] == pytest.approx(fewest["attrs"]["joules_to_target"])
    assert exported["recommended"]["config"]["target_return"] == 100
