"""``autotune study``: trials as fresh runs; unrunnable configs failed once and never retried;
a resumed study; and one real short run through the CLI."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import optuna
import pytest

from autotune.knobs import Machine, build_space
from autotune.offline import OfflineStudy
from autotune.study import open_study
from runtime.config import ConfigError, TrainConfig

KNOBS = ["actors=1..4", "batch_size=512,1024,2048", "envs_per_actor=8", "chunk_bytes=262144",
         "trainers=1", "trainer_threads=1", "rollout_len=32", "inference=actor"]  # fmt: skip


class FakeRuns:
    """Steps/J peak at 3 actors and batch 1024; actors=4 cannot run."""

    def __init__(self):
        self.ran: list[TrainConfig] = []

    def __call__(self, cfg: TrainConfig, warmup_s: float):
        if cfg.actors == 4:
            raise ConfigError(["actors=4: not enough cores (test)"])
        self.ran.append(cfg)
        spj = 100 - 10 * (cfg.actors - 3) ** 2 - 20 * abs(cfg.batch_size - 1024) / 1024
        rate = {"steps_per_s": spj * 10, "steps_per_joule": spj, "gpu_w": 0.0, "cpu_w": 10.0}
        return {"lost_steps": 0, "energy": {"cpu_source": "model"}}, rate


def _study(tmp_path, runs):
    space = build_space(Machine(cores=4, gpus=0), KNOBS)
    study = open_study(f"sqlite:///{tmp_path}/o.db", "o", seed=0)
    base = TrainConfig(env="CartPole-v1", steps=10**12, max_wall_s=10)
    return OfflineStudy(study, space, base, warmup_s=1.0, run=runs)


def test_offline_trials_find_the_best_and_never_rerun_an_unrunnable_config(tmp_path):
    runs = FakeRuns()
    offline = _study(tmp_path, runs)
    rows = [offline.step() for _ in range(24)]
    best = offline.study.best_trial
    assert best.params == {"actors": 3, "batch_size": 1024}
    unrunnable = [r for r in rows if r.error and r.error.startswith("not runnable")]
    assert unrunnable and all(r.values["actors"] == 4 for r in unrunnable)
    # each refused config was tried once; later suggestions of it were skipped, not run
    keys = [json.dumps(r.values, sort_keys=True) for r in unrunnable]
    assert len(keys) == len(set(keys))
    assert all(cfg.actors != 4 for cfg in runs.ran)
    assert all(cfg.max_wall_s == 10 and cfg.envs_per_actor == 8 for cfg in runs.ran)


def test_a_resumed_offline_study_keeps_its_trials_and_fails_orphans(tmp_path):
    offline = _study(tmp_path, FakeRuns())
    for _ in range(3):
        offline.step()
    offline.study.ask()  # a trial left RUNNING by a killed study
    again = _study(tmp_path, FakeRuns())
    states = [t.state for t in again.study.get_trials()]
    assert (
        states.count(optuna.trial.TrialState.COMPLETE) + states.count(optuna.trial.TrialState.FAIL)
        == 4
    )
    again.step()
    assert len(again.study.get_trials()) == 5


def test_study_cli_runs_a_real_trial_and_refuses_bad_input(tmp_path):
    env = {**os.environ, "COLUMNS": "200"}
    cmd = [sys.executable, "-m", "autotune.cli", "study", "--env", "CartPole-v1",
           "--storage", f"sqlite:///{tmp_path}/s.db", "--knob", "actors=2", "--knob",
           "envs_per_actor=8", "--knob", "trainers=1", "--knob", "trainer_threads=1",
           "--knob", "batch_size=1024"]  # fmt: skip
    out = subprocess.run([*cmd, "--trials", "1", "--trial-s", "14", "--warmup-s", "1",
                          "--json", str(tmp_path / "s.json")],
                         capture_output=True, text=True, timeout=180, env=env)  # fmt: skip
    assert out.returncode == 0, out.stderr
    doc = json.loads((tmp_path / "s.json").read_text())
    row = doc["trials"][0]
    assert row["error"] is None and row["steps_per_s"] > 0 and row["steps_per_joule"] > 0
    assert row["lost_steps"] == 0 and doc["best"]["cpu_source"] == "model"
    bad = subprocess.run([*cmd, "--trial-s", "5", "--warmup-s", "9"], capture_output=True,
                         text=True, timeout=60, env=env)  # fmt: skip
    assert bad.returncode == 2 and "need trials >= 1 and trial-s > warmup-s >= 0" in bad.stderr


@pytest.mark.parametrize("bad", ["actors=0", "nosuch=1"])
def test_study_refuses_bad_knobs(tmp_path, bad):
    out = subprocess.run([sys.executable, "-m", "autotune.cli", "study", "--knob", bad,
                          "--storage", f"sqlite:///{tmp_path}/s.db"],
                         capture_output=True, text=True, timeout=60)  # fmt: skip
    assert out.returncode == 2 and "error:" in out.stderr
