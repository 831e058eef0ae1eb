"""The online tuner: finds a best known by construction, honours failures, constraints and
saturation, resumes its study; ``train --tune`` drives a real run without losing steps."""

from __future__ import annotations

import json
import math
import os
import random
import re
import signal
import socket
import subprocess
import sys

import optuna
import pytest
import sqlalchemy.exc
from conftest import wait_until

from autotune.tuning.counters import Counters
from autotune.tuning.knobs import KnobError, Machine, build_space, default_space
from autotune.tuning.online_tuner import OnlineTuner, TunerSettings
from autotune.tuning.storage import StudyError, open_study
from runtime.config import ConfigError

BEST = {"actors": 6, "batch_size": 4096}


class World:
    """A job whose steps per joule peak at BEST by construction (2 % measurement noise)."""

    def __init__(
        self,
        seed: int,
        refuse: dict | None = None,
        stall: int | None = None,
        stuck: int | None = None,
        dark: int | None = None,
        meter_from: float = 0.0,
    ) -> None:
        self.t, self.values, self.rng, self.refuse = 0.0, {}, random.Random(seed), refuse
        self.last = self.steps = self.joules = self.lag = 0.0
        self.applied: list[dict] = []
        self.stall, self.stuck = stall, stuck  # actors values that train nothing / never settle
        self.ends_at: float | None = None  # the job's end (its wall limit), if it has one
        self.dark, self.meter_from = dark, meter_from  # no joules metered: that actors value;
        # before that time

    def apply(self, values):
        if values == self.refuse:
            raise ConfigError(["refused by the job"])
        self.values = dict(values)
        self.applied.append(dict(values))

    def ready(self):
        return self.values.get("actors") != self.stuck

    def counters(self):
        """Totals now: since the last reading, steps at the current config's rate (steps/J
        peaks at BEST; 2 % noise per reading) and joules to match."""
        dt, self.last = self.t - self.last, self.t
        if self.values and self.values.get("actors") != self.stall and dt > 0:
            a, b = self.values["actors"], self.values["batch_size"]
            spj = (100 - 4 * (a - 6) ** 2 - 6 * (math.log2(b) - 12) ** 2) * (
                1 + self.rng.gauss(0, 0.02)
            )
            self.steps += 1000 * spj * dt
            if self.values.get("actors") != self.dark and self.t > self.meter_from:
                self.joules += 1000 * dt
            self.lag += a / 2 * 1000 * spj * dt
        left = None if self.ends_at is None else max(self.ends_at - self.t, 0.0)
        return Counters(self.t, int(self.steps), self.lag, 0.0, self.joules, remaining_s=left)


def _tuner(tmp_path, world, seed=0, knobs=None, base=None, **settings):
    """A tuner of ``world`` over ``knobs`` (default: actors, with the batch size), starting
    from ``base``."""
    knobs = knobs or ["batch_size=1024..16384", "envs_per_actor=8", "chunk_bytes=262144"]
    space = build_space(Machine(cores=10, gpus=0), [*knobs, "trainers=1", "trainer_threads=1"])
    study = open_study(f"sqlite:///{tmp_path}/s.db", "s", seed=seed)
    opts = {"trials": 30, "warmup_s": 1.0, "window_s": 1.0, "window_max_s": 5.0, **settings}
    return OnlineTuner(
        study,
        space,
        world,
        TunerSettings(**opts),
        base or {"actors": 2, "batch_size": 1024},
        clock=lambda: world.t,
    )


def _run(tuner, world, trials):
    while tuner.trials_done < trials:
        world.t += 0.5
        tuner.tick()


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_finds_the_best_known_by_construction_within_30_trials(tmp_path, seed):
    world = World(seed)
    tuner = _tuner(tmp_path, world, seed)
    _run(tuner, world, 30)
    assert tuner.best()["values"] == BEST
    assert world.applied[0] == {"actors": 2, "batch_size": 1024}  # the default is trial 0
    # the incumbent was measured more than once (noise handling)
    assert tuner.best()["measurements"] >= 2


def test_after_the_budget_it_holds_the_best_and_rechecks_it(tmp_path):
    world = World(0)
    tuner = _tuner(tmp_path, world, trials=20, recheck_s=10.0)
    _run(tuner, world, 20)
    for _ in range(100):
        world.t += 0.5
        tuner.tick()
    held = [w for w in tuner.log if w["state"] == "hold"]
    assert len(held) >= 3 and all(w["values"] == tuner.best()["values"] for w in held)


def test_near_the_jobs_end_it_holds_the_best_instead_of_another_trial(tmp_path):
    """A trial takes a warm-up and a window (2 s here); with less than twice that left, no new
    config is tried: the best so far runs to the end."""
    world = World(0)
    tuner = _tuner(tmp_path, world, recheck_s=1000.0)
    _run(tuner, world, 4)
    world.ends_at = world.t + 3.9  # under 2 x (1 s warm-up + the 1-s windows measured)
    applied, done = len(world.applied), tuner.trials_done
    for _ in range(40):
        world.t += 0.5
        tuner.tick()
    best = tuner.best()["values"]
    assert tuner.trials_done == done + 1 and tuner.holding  # the trial in flight, no other
    assert world.applied[applied:] == [best] and world.values == best
    # with time enough left it explores as before
    world = World(0)
    (tmp_path / "more").mkdir()
    tuner = _tuner(tmp_path / "more", world)
    world.ends_at = 1e9
    _run(tuner, world, 8)
    assert not tuner.holding


def test_a_refused_config_is_failed_and_never_applied_again(tmp_path):
    refused = {"actors": 6, "batch_size": 4096}
    world = World(0, refuse=refused)
    tuner = _tuner(tmp_path, world)
    _run(tuner, world, 30)
    assert refused not in world.applied
    assert tuner.best()["values"] != refused
    failed = tuner.study.get_trials(states=(optuna.trial.TrialState.FAIL,))
    assert failed and "refused by the job" in failed[0].user_attrs["error"]


def test_a_lag_ceiling_keeps_infeasible_configs_from_being_best(tmp_path):
    world = World(0)  # lag = actors / 2: actors 6 has lag 3
    tuner = _tuner(tmp_path, world, max_policy_lag=2.0)
    _run(tuner, world, 30)
    assert tuner.best()["values"]["actors"] <= 4


def test_a_restarted_tuner_resumes_the_study_and_fails_orphaned_trials(tmp_path):
    world = World(0)
    tuner = _tuner(tmp_path, world)
    _run(tuner, world, 5)
    tuner.tick()  # asks trial 6 and applies it: RUNNING when the "crash" happens
    running = tuner.study.get_trials(states=(optuna.trial.TrialState.RUNNING,))
    assert running and running[0].user_attrs["owner"].split(":")[1] == str(os.getpid())
    # the tuner's process "dies": its trial now names a process that no longer runs
    dead = f"{socket.gethostname()}:{os.getpid()}:0.00"  # same pid, another start time
    tuner.study._storage.set_trial_user_attr(running[0]._trial_id, "owner", dead)
    world2 = World(1)
    again = _tuner(tmp_path, world2)
    trials = again.study.get_trials()
    assert not [t for t in trials if t.state == optuna.trial.TrialState.RUNNING]
    assert sum(t.state == optuna.trial.TrialState.COMPLETE for t in trials) == 5
    # the history is rebuilt from the study: trial count, medians and the best so far
    assert again.trials_done == 6
    assert again.best() == tuner.best()
    _run(again, world2, 9)
    finished = [t for t in again.study.get_trials() if t.state != optuna.trial.TrialState.RUNNING]
    assert len(finished) == len(trials) + 3


def test_a_trial_being_asked_elsewhere_is_not_failed_as_an_orphan(tmp_path, monkeypatch):
    """Between ``study.ask()`` and its ``owner`` attribute a trial is RUNNING with no owner;
    another process opening the study then (a second study worker) must leave it alone. It
    failed it once, and the asking worker crashed on its next attribute."""
    from autotune.tuning import storage as study_mod

    study = optuna.create_study(storage=f"sqlite:///{tmp_path}/o.db", study_name="o")
    trial = study.ask()  # no owner yet: as if the other process were inside ask()
    study_mod.fail_orphans(study)
    assert study.get_trials()[0].state == optuna.trial.TrialState.RUNNING
    trial.set_user_attr("beat", 1.0)  # what used to raise UpdateFinishedTrialError
    monkeypatch.setattr(study_mod, "ASK_GRACE_S", -1.0)  # long past: a crash left it ownerless
    study_mod.fail_orphans(study)
    assert study.get_trials()[0].state == optuna.trial.TrialState.FAIL


def test_configs_that_stall_training_or_never_take_effect_are_failed(tmp_path):
    world = World(0, stall=3, stuck=4)
    tuner = _tuner(tmp_path, world, settle_timeout_s=20.0)
    _run(tuner, world, 30)
    failed = tuner.study.get_trials(states=(optuna.trial.TrialState.FAIL,))
    errors = {t.params["actors"]: t.user_attrs["error"] for t in failed if "error" in t.user_attrs}
    assert "no env step trained in 3 windows of 5 s" in errors[3]
    assert "did not take effect within 20 s" in errors[4]
    assert tuner.best()["values"] == BEST


def test_constraints_no_config_meets_restore_the_default_and_say_so(tmp_path):
    world = World(0)
    tuner = _tuner(tmp_path, world, trials=8, min_steps_per_s=1e9)
    _run(tuner, world, 8)
    for _ in range(10):
        world.t += 0.5
        tuner.tick()
    assert tuner.best() is None
    assert "no config met the constraints in 8 trials (floor 1000000000.0 steps/s" in tuner.unmet
    assert world.applied[-1] == {"actors": 2, "batch_size": 1024}  # back to the default
    with pytest.raises(ValueError, match="max_policy_lag=-1: a ceiling is a finite number"):
        _tuner(tmp_path, World(0), max_policy_lag=-1)


def test_a_job_started_outside_the_narrowed_space_is_tuned_without_its_default(tmp_path):
    world = World(0)
    space = build_space(
        Machine(cores=10, gpus=0),
        [
            "actors=4..8",
            "batch_size=1024..16384",
            "envs_per_actor=8",
            "chunk_bytes=262144",
            "trainers=1",
            "trainer_threads=1",
        ],
    )
    study = open_study(f"sqlite:///{tmp_path}/o.db", "o", seed=0)
    tuner = OnlineTuner(
        study,
        space,
        world,
        TunerSettings(warmup_s=1.0, window_s=1.0),
        {"actors": 2, "batch_size": 1024},
        clock=lambda: world.t,
    )
    _run(tuner, world, 8)
    assert world.applied and all(4 <= v["actors"] <= 8 for v in world.applied)


def test_a_grid_tuner_measures_every_combination_once(tmp_path):
    world = World(0)
    space = build_space(
        Machine(cores=10, gpus=0),
        [
            "actors=2,6",
            "batch_size=1024,4096,16384",
            "envs_per_actor=8",
            "chunk_bytes=262144",
            "trainers=1",
            "trainer_threads=1",
            "rollout_len=32",
            "inference=actor",
        ],
    )
    grid = {k.name: list(k.choices) for k in space.values() if k.online}
    study = open_study(f"sqlite:///{tmp_path}/g.db", "g", seed=0, grid=grid)
    tuner = OnlineTuner(
        study,
        space,
        world,
        TunerSettings(sampler="grid", warmup_s=1.0, window_s=1.0),
        {"actors": 2, "batch_size": 1024},
        clock=lambda: world.t,
    )
    assert tuner.explore_until == 6
    _run(tuner, world, 6)
    measured = {json.dumps(t.params, sort_keys=True) for t in study.get_trials()}
    assert len(measured) == 6 and tuner.best()["values"] == BEST


def test_bad_knobs_and_storage_are_refused_with_what_is_allowed(tmp_path):
    machine = Machine(cores=4, gpus=0)
    with pytest.raises(KnobError, match="unknown knob 'actor'; knobs: actors"):
        build_space(machine, ["actor=2"])
    with pytest.raises(KnobError, match=r"actors='9..12' leaves no value; allowed: 1\.\.4"):
        build_space(machine, ["actors=9..12"])
    with pytest.raises(KnobError, match="batch_size='1000': allowed values are 512, 1024"):
        build_space(machine, ["batch_size=1000"])
    with pytest.raises(KnobError, match=r"actors='4..2': the range is reversed .*give 2\.\.4"):
        build_space(machine, ["actors=4..2"])
    with pytest.raises(KnobError, match="mps_pct cannot be set here: no CUDA GPU"):
        build_space(machine, ["mps_pct=50"])
    with pytest.raises(StudyError, match="cannot open study 'x' in storage 'nosuch://'"):
        open_study("nosuch://", "x")
    space = build_space(machine, ["actors=2", "batch_size=1024..4096"])
    assert space["actors"].choices == (2,) and not space["actors"].online
    assert space["batch_size"].choices == (1024, 2048, 4096)
    assert not space["mps_pct"].online and space["mps_pct"].unavailable
    # an opt-in knob (it changes what the learner computes) is tuned only when named
    assert "trainer_precision" not in space
    space = build_space(machine, ["trainer-precision=fp32,bf16"])
    knob = space["trainer_precision"]
    assert knob.choices == ("fp32", "bf16") and knob.apply == "handover" and knob.online
    with pytest.raises(KnobError, match="trainer_precision='fp16': allowed values are fp32, bf16"):
        build_space(machine, ["trainer_precision=fp16"])
    # actor niceness pays on some workloads only: tuned when named, any of 0..19
    assert "actor_nice" not in build_space(machine)
    knob = build_space(machine, ["actor_nice=0,10"])["actor_nice"]
    assert knob.choices == (0, 10) and knob.apply == "respawn" and knob.online
    with pytest.raises(KnobError, match=r"actor_nice='20': allowed values are 0\.\.19"):
        build_space(machine, ["actor_nice=20"])
    # the tuner tries 1, 2 and 4 trainer threads; a user may name any count up to the cores
    assert default_space(machine)["trainer_threads"].choices == (1, 2, 4)
    assert build_space(Machine(16, 0), ["trainer_threads=3,5,6"])["trainer_threads"].choices == (
        3,
        5,
        6,
    )
    assert build_space(machine, ["trainer_threads=2..8"])["trainer_threads"].choices == (2, 3, 4)
    twice = build_space(machine, ["trainer_threads=2..3", "trainer_threads=1..4"])
    assert twice["trainer_threads"].choices == (2, 3)  # a second --knob narrows, never widens
    with pytest.raises(KnobError, match=r"trainer_threads='5': allowed values are 1\.\.4"):
        build_space(machine, ["trainer_threads=5"])


@pytest.mark.slow
def test_train_tune_drives_a_real_run_and_keeps_every_step(tmp_path):
    """A real tuned run, with the ``weighted`` objective (the model sampler rates its
    predictions by it, against the study's first window): trials are measured, no step is lost,
    and status shows the learning curve around each change."""
    out, db = tmp_path / "out.json", tmp_path / "t.db"
    cmd = [sys.executable, "-m", "autotune.cli", "train", "--tune", "--quiet"]
    cmd += ["--objective", "weighted", "--steps", "1000000000", "--max-wall-s", "600"]
    cmd += ["--tune-window-s", "1.5", "--tune-warmup-s", "0.5"]
    # the run's step accounting and its study are checked, not a window's precision
    cmd += ["--tune-window-max-s", "2"]
    cmd += ["--knob", "batch_size=512,1024", "--knob", "envs_per_actor=4,8"]
    cmd += ["--knob", "chunk_bytes=262144", "--knob", "trainers=1"]
    cmd += ["--knob", "trainer_threads=1", "--knob", "actors=2"]
    cmd += ["--storage", f"sqlite:///{db}", "--json", str(out)]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)

    def measured(n: int) -> bool:
        try:
            study = optuna.load_study(study_name="online-CartPole-v1", storage=f"sqlite:///{db}")
        except (KeyError, sqlalchemy.exc.SQLAlchemyError):  # not created yet, or being created
            return False
        return sum(t.state == optuna.trial.TrialState.COMPLETE for t in study.trials) >= n

    # waits on windows measured, not on seconds: then Ctrl-C drains the run
    wait_until(lambda: measured(2), proc, what="two measured trials")
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err[-3000:]
    r = json.loads(out.read_text())
    assert r["lost_steps"] == 0
    assert r["sampled_steps"] == r["env_steps"] + r["discarded_steps"]
    tuning = r["tuning"]
    assert tuning["trials"] >= 2 and tuning["best"] is not None
    assert {k for k, v in tuning["knobs"].items() if v["tuned"]} == {"batch_size", "envs_per_actor"}
    study = optuna.load_study(study_name="online-CartPole-v1", storage=f"sqlite:///{db}")
    completed = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    assert len(completed) >= 2
    assert completed[0].value == pytest.approx(1.0)  # the first window is weighted's yardstick
    # `autotune status` of the stored study: the learning curve around each change, and the
    # gradient noise scale the latest trial measured
    cli = [sys.executable, "-m", "autotune.cli", "status", "--storage", f"sqlite:///{db}"]
    status = subprocess.run(
        [*cli, "--study", "online-CartPole-v1", "--json", str(tmp_path / "st.json")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert status.returncode == 0, status.stderr[-2000:]
    doc = json.loads((tmp_path / "st.json").read_text())["jobs"][0]
    done = [t for t in doc["trials"] if t["state"] == "COMPLETE"]
    assert all(t["return_after"] is not None for t in done), done
    assert any(t["return_before"] is not None for t in done), done  # a change after the first
    assert doc["noise_scale"] == [t["noise_scale"] for t in done if t["noise_scale"]][-1] > 0
    assert "gradient noise scale (at the latest trial)" in status.stdout
    # the trial table's note (wrapped within its column at a narrow terminal)
    assert re.search(r"return -?[\d.,]+ ->", " ".join(status.stdout.split())), status.stdout
