"""A wrap study's identity and its first trial: a study made for another command or knobs is
refused unless resumed, and trial one runs the script's own defaults."""

from __future__ import annotations

import json

import optuna
from test_wrap import _wrap


def test_a_study_made_for_another_command_or_knobs_is_refused_unless_resumed(tmp_path):
    first = _wrap(tmp_path, "--knob", "num_envs=2", "--knob", "mode=ok", "--trials", "1")
    assert first.returncode == 0, first.stderr
    other = _wrap(tmp_path, "--knob", "num_envs=1..2", "--knob", "mode=ok", "--trials", "1")
    said = " ".join(other.stderr.split())
    assert other.returncode == 2, other.stderr
    assert "was made for another run (knobs: ['num_envs=2', 'mode=ok'] then," in said
    assert "give --resume to go on with it, or a new --study name" in said
    study = optuna.load_study(study_name="wrap-train", storage=f"sqlite:///{tmp_path}/w.db")
    assert len(study.trials) == 1  # nothing ran
    again = _wrap(
        tmp_path, "--knob", "num_envs=1..2", "--knob", "mode=ok", "--trials", "1", "--resume"
    )
    assert again.returncode == 0, again.stderr
    study = optuna.load_study(study_name="wrap-train", storage=f"sqlite:///{tmp_path}/w.db")
    assert study.user_attrs["wrap"]["knobs"] == ["num_envs=1..2", "mode=ok"]


def test_trial_one_runs_the_scripts_own_defaults(tmp_path):
    out = _wrap(tmp_path, "--knob", "num_envs=1..4", "--default", "num_envs=3", "--trials", "2")
    assert out.returncode == 0, out.stderr
    doc = json.loads((tmp_path / "w.json").read_text())
    assert doc["trials"][0]["values"] == {"num_envs": 3}
    bad = _wrap(tmp_path, "--knob", "num_envs=1..4", "--default", "num_envs=9", "--study", "x")
    said = " ".join(bad.stderr.split())
    assert bad.returncode == 2 and "--default 'num_envs=9': 9 is not among [1, 2, 3, 4]" in said
