"""A wrapped script's study exported: the CleanRL-style PPO of ``examples/`` wrapped in restart
mode with placeholders, ``--export`` at the end and ``autotune export --study`` after; trials
timed from the script's first report, or its first output line when it never reports."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import optuna
import yaml
from conftest import wait_until

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "ppo_gymnasium.py"

SLOW_START = """
import time
from autotune import client
time.sleep(1.5)                      # start-up: imports, env construction
steps = 0
for _ in range(6):
    x = sum(j * j for j in range(300000))
    steps += 1000
    client.report(steps=steps)
"""

SILENT = """
import time
time.sleep(1.0)                      # start-up, nothing printed yet
print("training", flush=True)
x = sum(j * j for j in range(3000000))
"""


def _cli(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    env = {**os.environ, "COLUMNS": "200"}
    return subprocess.run(
        [sys.executable, "-m", "autotune.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )


def test_a_wrapped_cleanrl_style_script_is_exported_with_its_command_filled_in(tmp_path):
    """The example under wrap with its flags substituted, each trial's output passed through;
    its study exported."""
    db = f"sqlite:///{tmp_path}/w.db"
    out = _cli(
        "wrap",
        "--storage",
        db,
        "--study",
        "ppo",
        "--knob",
        "num_envs=2,4",
        "--knob",
        "batch_size=256",
        "--default",
        "num_envs=4",
        "--trials",
        "3",
        "--json",
        str(tmp_path / "e.json"),
        "--export",
        str(tmp_path / "ppo.json"),
        "--plots",
        str(tmp_path / "plots"),
        "--",
        sys.executable,
        str(EXAMPLE),
        "--total-steps",
        "3072",
        "--num-envs",
        "{num_envs}",
        "--batch-size",
        "{batch_size}",
    )
    assert out.returncode == 0, out.stderr
    trials = json.loads((tmp_path / "e.json").read_text())["trials"]
    assert [r["error"] for r in trials] == [None, None, None]
    assert all(r["steps"] >= 3072 and r["metrics"]["episode_return"] > 0 for r in trials)
    assert out.stdout.count("steps in") == 3  # the example's own output passed through
    doc = json.loads((tmp_path / "ppo.json").read_text())
    assert doc["kind"] == "wrap" and doc["unit"] == "steps"
    assert doc["picked_by"] == "steps_per_joule"
    values = doc["recommended"]["values"]
    assert values["batch_size"] == 256 and values["num_envs"] in (2, 4)
    cmd = doc["recommended"]["command"]
    assert cmd[-4:] == ["--num-envs", str(values["num_envs"]), "--batch-size", "256"]
    assert json.loads(doc["recommended"]["environment"]["AUTOTUNE_KNOBS"]) == values
    ev = doc["evidence"]
    assert ev["trials"]["complete"] == 3 and ev["trials"]["configs"] == 2
    rec = ev["recommended"]
    assert rec["steps_per_joule"]["median"] > 0 and rec["steps_per_s"]["median"] > 0
    assert rec["steps_per_joule"]["min"] <= rec["steps_per_joule"]["max"]
    # trial one ran the script's own default, and the recommendation is compared with it
    assert ev["default"]["values"] == {"num_envs": 4, "batch_size": 256}
    assert ev["default"]["trials"] and ev["steps_per_joule_vs_default"] >= 1.0
    assert (tmp_path / "plots" / "per_joule_by_trial.png").stat().st_size > 0
    assert (tmp_path / "plots" / "per_joule_vs_num_envs.png").stat().st_size > 0
    # every trial was measured from the script's first report, start-up left out
    study = optuna.load_study(study_name="ppo", storage=db)
    for t in study.get_trials(states=(optuna.trial.TrialState.COMPLETE,)):
        assert t.user_attrs["window"]["from"] == "first report"
        assert t.user_attrs["window"]["s"] < t.user_attrs["wall_s"]
    # the same document from autotune export, as YAML; the recommended command runs as is
    again = _cli("export", "--storage", db, "--study", "ppo", "--out", str(tmp_path / "p.yaml"))
    assert again.returncode == 0, again.stderr
    assert yaml.safe_load((tmp_path / "p.yaml").read_text())["recommended"] == doc["recommended"]
    assert "recommended:" in again.stderr
    rerun = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert rerun.returncode == 0, rerun.stderr


def test_start_up_is_left_out_of_a_trial_and_a_silent_script_counts_runs(tmp_path):
    db = f"sqlite:///{tmp_path}/w.db"
    for name, text in (("slow", SLOW_START), ("silent", SILENT)):
        script = tmp_path / f"{name}.py"
        script.write_text(text)
        out = _cli(
            "wrap",
            "--storage",
            db,
            "--study",
            name,
            "--knob",
            "x=1",
            "--trials",
            "1",
            "--export",
            str(tmp_path / f"{name}.json"),
            "--",
            sys.executable,
            str(script),
        )
        assert out.returncode == 0, out.stderr
    slow = optuna.load_study(study_name="slow", storage=db).trials[0].user_attrs
    assert slow["window"]["from"] == "first report" and slow["window"]["amount"] == 5000
    assert slow["window"]["s"] < slow["wall_s"] - 1.2  # the 1.5-s start-up is not in it
    silent = optuna.load_study(study_name="silent", storage=db).trials[0].user_attrs
    assert silent["window"]["from"] == "first output line" and silent["window"]["amount"] == 1
    assert silent["window"]["s"] < silent["wall_s"] - 0.8
    doc = json.loads((tmp_path / "silent.json").read_text())
    assert doc["unit"] == "runs" and "runs per joule" in doc["evidence"]["note"]


def test_export_refuses_an_unknown_study_kind_and_names_what_it_takes(tmp_path):
    db = f"sqlite:///{tmp_path}/w.db"
    optuna.create_study(study_name="bare", storage=db)
    out = _cli("export", "--storage", db, "--study", "bare")
    assert out.returncode == 2
    assert "autotune study --env" in out.stderr and "autotune wrap" in out.stderr


UNTIL_TOLD = """
import os, sys, time
from autotune import client
steps = 0
while not os.path.exists(sys.argv[1]):
    x = sum(j * j for j in range(100000))
    steps += 100
    client.report(steps=steps)
    time.sleep(0.05)
"""


def test_a_running_wrap_shows_its_rates_in_the_terminal_and_in_status(tmp_path):
    db = f"sqlite:///{tmp_path}/w.db"
    script, stop = tmp_path / "run.py", tmp_path / "stop"
    script.write_text(UNTIL_TOLD)
    cmd = [sys.executable, "-m", "autotune.cli", "wrap", "--storage", db, "--study", "live"]
    cmd += ["--knob", "x=1", "--trials", "1", "--", sys.executable, str(script), str(stop)]
    env = {**os.environ, "COLUMNS": "200"}
    wrap = subprocess.Popen(
        cmd, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True, env=env
    )
    seen: list[str] = []

    def status_shows_rates() -> bool:
        seen.append(_cli("status", "--storage", db, "--study", "live").stdout)
        return "now (last" in seen[-1]

    err = ""
    try:
        wait_until(status_shows_rates, wrap, 240, "autotune status showing the wrap's rates")
        assert "steps/s" in seen[-1] and "steps/J" in seen[-1] and "trial 0" in seen[-1]
    except AssertionError as exc:  # with what the wrap said, and what status showed last
        stop.write_text("")
        _, err = wrap.communicate(timeout=240)
        raise AssertionError(f"{exc}\nwrap's stderr:\n{err[-3000:]}\nstatus: {seen[-1:]}") from exc
    finally:
        stop.write_text("")
        if wrap.returncode is None:  # not read above
            _, err = wrap.communicate(timeout=240)
    assert wrap.returncode == 0, err
    lines = [ln for ln in err.splitlines() if ln.startswith("  trial 0: ")]  # progress lines
    assert lines and "steps/s" in lines[0] and "steps/J" in lines[0]
    # once the wrap is over, status no longer shows it as running
    assert "now (last" not in _cli("status", "--storage", db, "--study", "live").stdout


def test_an_export_path_that_cannot_be_written_is_refused_before_any_trial(tmp_path):
    db = f"sqlite:///{tmp_path}/w.db"
    (tmp_path / "a-file").write_text("")
    out = _cli(
        "wrap",
        "--storage",
        db,
        "--study",
        "kept",
        "--knob",
        "x=1",
        "--trials",
        "1",
        "--export",
        str(tmp_path / "a-file" / "x.json"),
        "--",
        sys.executable,
        "-c",
        "print(1)",
    )
    said = " ".join(out.stderr.split())
    assert out.returncode == 2 and "a-file is a file, not a directory" in said
    assert "trial 0" not in said  # no trial ran, to be lost at the end
