"""``autotune export`` of a wrapped script's study (``autotune study ... -- CMD``): the script's
best knob values, its command with them filled in, and the evidence, as for ``autotune wrap``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import optuna
import pytest
import yaml

from autotune.tuning.offline_study import OfflineStudy
from autotune.tuning.storage import open_study
from autotune.tuning.trials import Measured, ScriptTrials
from autotune.workflows.export import ExportError
from autotune.workflows.wrap_export import is_wrap_study, wrap_export_doc
from autotune.wrap.wrapper import parse_knob

SCRIPT = Path(__file__).parents[2] / "fixtures" / "scripts" / "reporting.py"
"""Reports three steps of ``num_envs`` x 100 steps each (``tests/fixtures/scripts``)."""


def _cli(*args: str, timeout: float = 180) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "autotune.cli.main", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "COLUMNS": "200"},
    )


def test_a_script_study_exports_the_scripts_best_values_and_command(tmp_path):
    storage = f"sqlite:///{tmp_path}/s.db"
    out = _cli(
        *("study", "--knob", "num_envs=1,2,4", "--knob", "mode=fast", "--trials", "3"),
        *("--trial-s", "30", "--warmup-s", "0", "--objective", "both", "--storage", storage),
        *("--", sys.executable, str(SCRIPT), "--mode", "{mode}", "--envs", "{num_envs}"),
    )
    assert out.returncode == 0, out.stderr[-3000:]
    out = _cli(
        *("export", "--study", "study-reporting", "--storage", storage),
        *("--out", str(tmp_path / "e.yaml"), "--plots", str(tmp_path / "plots")),
    )
    assert out.returncode == 0, out.stderr[-3000:]
    doc = yaml.safe_load((tmp_path / "e.yaml").read_text())
    study = optuna.load_study(study_name="study-reporting", storage=storage)
    done = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    best = max(done, key=lambda t: t.user_attrs["steps_per_joule"])  # "both": steps/J picks
    values = doc["recommended"]["values"]
    assert values == {"mode": "fast", "num_envs": best.params["num_envs"]}
    assert doc["kind"] == "wrap" and doc["picked_by"] == "steps_per_joule"
    assert doc["workload"]["made_by"] == "autotune study -- CMD" and doc["unit"] == "steps"
    assert doc["recommended"]["command"][-4:] == [
        "--mode",
        "fast",
        "--envs",
        str(values["num_envs"]),
    ]
    assert doc["recommended"]["environment"]["AUTOTUNE_MODE"] == "fast"
    ev = doc["evidence"]
    assert ev["default"]["values"] == {"mode": "fast", "num_envs": 1} and ev["default"]["trials"]
    assert ev["trials"]["complete"] == len(done) and ev["recommended"]["cpu_w"] > 0
    assert "command: " in out.stderr and (tmp_path / "plots" / "per_joule_by_trial.png").exists()
    from autotune.api import export

    assert export("study-reporting", storage)["recommended"]["values"] == values
    refused = _cli("export", "--study", "study-reporting", "--storage", storage, "--sms", "8")
    assert refused.returncode == 2 and "a wrapped script's study holds its knobs" in refused.stderr
    refused = _cli(
        *("export", "--study", "study-reporting", "--storage", storage),
        *("--pick", "goodput_per_joule"),
    )
    assert refused.returncode == 2
    assert "allowed for a wrapped script's study steps_per_joule, steps_per_s" in refused.stderr


class ScoredTrials(ScriptTrials):
    """Script trials scored without a script: steps/J = ``n`` x the machine's speed when it
    runs (``speeds``, one per run)."""

    def __init__(self, space, speeds: list[float]) -> None:
        super().__init__(wrapper=None, space=space)
        self.speeds = iter(speeds)

    def __call__(self, number: int, values: dict) -> Measured:
        spj = values["n"] * next(self.speeds)
        return Measured(spj * 10, spj, {"unit": "steps", "wall_s": 1.0, "cpu_j": 5.0})


def test_a_script_study_with_references_is_picked_by_its_scaled_figures(tmp_path):
    """A config measured while the machine ran twice as fast is not picked for that: with
    reference runs the export ranks by the figures scaled to the first reference."""
    space = [parse_knob("n=1,2,3"), parse_knob("tag=x")]
    study = open_study(f"sqlite:///{tmp_path}/r.db", "r", seed=0, metrics=("steps_per_joule",))
    meta = {"objective": "steps_per_joule", "trial_s": 5, "kind": "script", "cmd": ["s", "{tag}"]}
    study.set_user_attr("autotune", {**meta, "knobs": ["n=1,2,3", "tag=x"], "default": {"n": 1}})
    trials = ScoredTrials(space, [1.0, 1.0, 2.0, 2.0])  # the machine twice as fast from run 3
    offline = OfflineStudy(study, trials, reference_every=1, profile=False)
    rows = [offline.step()]  # the default, n=1: 1 step/J
    study.enqueue_trial({"n": 3})
    rows.append(offline.step())  # n=3: 3
    study.enqueue_trial({"n": 2})
    rows += [offline.step(), offline.step()]  # a reference (n=1: 2 raw), then n=2: 4 raw
    assert [(r.role, r.values["n"]) for r in rows if r.error is None] == [
        ("default", 1),
        ("sampler", 3),
        ("reference", 1),
        ("sampler", 2),
    ]
    assert is_wrap_study(study)
    doc = wrap_export_doc(study)
    assert doc["recommended"]["values"] == {"tag": "x", "n": 3}  # raw, n=2 would win
    assert doc["recommended"]["command"] == ["s", "x"]
    assert doc["evidence"]["default"]["values"] == {"tag": "x", "n": 1}
    assert len(doc["evidence"]["default"]["trials"]) == 2  # the default and the reference
    assert doc["evidence"]["recommended"]["cpu_w"] == 5.0
    with pytest.raises(ExportError, match="allowed for a wrapped script's study"):
        wrap_export_doc(study, pick="target_per_mj")
    assert json.loads(json.dumps(doc)) == doc  # plain data
