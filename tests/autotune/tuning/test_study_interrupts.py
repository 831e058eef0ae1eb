"""An offline study cut short: stopped mid-trial by a signal, or by a run too short to measure.
Neither is held against the config that was running."""

from __future__ import annotations

import subprocess
import sys

import optuna
from test_offline_study import FakeRuns, _study


def test_a_study_stopped_mid_trial_stops_and_runs_that_config_first_when_resumed(tmp_path):
    """SIGTERM (or Ctrl-C) while a trial's run trains: the run drains, the study stops with the
    trial failed as interrupted (not its config's fault) and its config queued to run first
    when the study is resumed, in its role (the default config's here); no later trial
    starts."""
    import contextlib
    import signal

    import psutil
    from conftest import wait_until

    db = f"sqlite:///{tmp_path}/s.db"
    cmd = [sys.executable, "-m", "autotune.cli", "study", "--env", "CartPole-v1", "--storage", db]
    cmd += ["--study", "cut", "--trials", "3", "--trial-s", "240", "--warmup-s", "30"]
    cmd += ["--knob", "actors=1", "--knob", "trainers=1", "--knob", "trainer_threads=1"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def training() -> bool:
        titles = []
        for child in psutil.Process(proc.pid).children(recursive=True):
            with contextlib.suppress(psutil.Error):
                titles.append(" ".join(child.cmdline()))
        return any(t.startswith("autotune: actor") for t in titles)

    wait_until(training, proc, what="the first trial's actors")
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=180)
    assert proc.returncode == 130, err[-2000:]
    study = optuna.load_study(study_name="cut", storage=db)
    states = [t.state.name for t in study.trials]
    assert states == ["FAIL", "WAITING"], states  # no second trial started
    first, queued = study.trials
    assert "Ctrl-C" in first.user_attrs.get("interrupted", "")
    assert queued.system_attrs.get("fixed_params") == first.params
    assert queued.user_attrs.get("role") == first.user_attrs.get("role") == "default"  # kept


def test_a_run_too_short_to_measure_does_not_mark_its_config_unrunnable(tmp_path):
    """``--trial-s`` too short for the warm-up is not the config's fault: the trial fails as
    interrupted and the config may be run again (with a longer --trial-s it would measure)."""
    from autotune.tuning.trials import TooShort

    class ShortAtTwo(FakeRuns):
        def __call__(self, cfg, warmup_s, meter=None):
            if cfg.actors == 2:
                raise TooShort("trained too little to measure (test)")
            return super().__call__(cfg, warmup_s, meter)

    offline = _study(tmp_path, ShortAtTwo())
    rows = [offline.step() for _ in range(16)]
    short = [r for r in rows if r.values.get("actors") == 2]
    assert short and all("trained too little" in (r.error or "") for r in short)
    assert not any("failed before" in (r.error or "") for r in short)  # run again, not skipped
    fails = [t for t in offline.study.trials if t.params.get("actors") == 2]
    assert all("trained too little" in t.user_attrs.get("interrupted", "") for t in fails)
