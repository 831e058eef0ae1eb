"""A study whose first trial, the default config every other is compared with, was cut (a
signal drained its run, the job ended mid-window, or its process died) measures that config
first when resumed,
and it keeps its role there: the offline study's reference, the online tuner's yardstick."""

from __future__ import annotations

import os
import socket

import optuna
from optuna.trial import TrialState
from test_offline_study import FakeRuns, _study
from test_online_tuner import World, _run, _tuner

from autotune.tuning.knobs import Machine, build_space
from autotune.tuning.offline_study import OfflineStudy
from autotune.tuning.storage import open_study
from autotune.tuning.trials import TrainTrials, TrialFailed, _unless_stopped
from runtime.config import TrainConfig

KNOBS = ["actors=1..3", "batch_size=512,1024", "envs_per_actor=8", "chunk_bytes=262144"]
KNOBS += ["trainers=1", "trainer_threads=1", "rollout_len=32", "inference=actor"]


class CutFirst(FakeRuns):
    """The first run is cut: drained by a signal (``signal``) or killed from outside."""

    def __init__(self, signal: bool) -> None:
        super().__init__()
        self.signal, self.cut = signal, True

    def __call__(self, cfg: TrainConfig, warmup_s: float, meter=None):
        if self.cut:
            self.cut = False
            if self.signal:
                _unless_stopped({"interrupted": True})  # as a drained run's result says
            raise TrialFailed("run failed: killed by signal 9", killed=True)
        return super().__call__(cfg, warmup_s, meter)


def _offline(tmp_path, runs) -> OfflineStudy:
    space = build_space(Machine(cores=4, gpus=0), KNOBS)
    study = open_study(f"sqlite:///{tmp_path}/o.db", "o", seed=0)
    base = TrainConfig(env="CartPole-v1", steps=10**12, max_wall_s=10)
    trials = TrainTrials(space, base, warmup_s=1.0, run=runs)
    return OfflineStudy(study, trials, reference_every=2)


def test_a_cut_default_trial_is_run_again_first_as_the_default_the_others_scale_by(tmp_path):
    for signal in (True, False):
        path = tmp_path / str(signal)
        path.mkdir()
        runs = CutFirst(signal)
        offline = _offline(path, runs)
        try:
            offline.step()
        except KeyboardInterrupt:
            assert signal
        again = _offline(path, runs) if signal else offline  # a killed run goes on at once
        rows = [again.step() for _ in range(5)]
        trials = again.study.get_trials(deepcopy=False)
        cut, first = trials[0], trials[1]
        assert cut.state == TrialState.FAIL and cut.user_attrs["role"] == "default"
        assert first.state == TrialState.COMPLETE and first.params == cut.params
        assert first.user_attrs["role"] == "default", first.user_attrs
        defaults = [t.number for t in trials if t.user_attrs.get("role") == "default"]
        assert defaults == [0, 1]  # no other trial takes the role
        later = [t for t in trials[2:] if t.state == TrialState.COMPLETE]
        assert later and all(t.user_attrs["reference_trial"] is not None for t in later)
        assert any(r.role == "reference" for r in rows)  # references run after it, as due
        assert later[0].user_attrs["reference_trial"] == 1


def test_a_resumed_tuner_measures_a_cut_start_config_first_and_rates_by_it(tmp_path):
    """The job ended while its start config was measured: the next job's tuner on the study
    measures that config first, and a ``weighted`` objective rates every window by it."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    world = World(0)
    tuner = _tuner(tmp_path, world, objective="weighted")
    while tuner.current is None or tuner.current.phase != "measure":
        world.t += 0.5
        tuner.tick()
    tuner.close("job ended")
    start = tuner.base
    again = World(1)
    again.t = world.t
    resumed = _tuner(tmp_path, again, objective="weighted")
    _run(resumed, again, 4)
    done = [t for t in resumed.study.trials if t.state == TrialState.COMPLETE]
    assert done[0].params == start and done[0].value == 1.0
    assert resumed.reference.steps_per_s == done[0].user_attrs["steps_per_s"]
    # resumed again: the start config, measured now, is not queued a second time
    _tuner(tmp_path, World(2), objective="weighted")
    waiting = resumed.study.get_trials(deepcopy=False, states=(TrialState.WAITING,))
    assert not waiting


def test_a_default_trial_whose_process_died_runs_first_again_in_its_role(tmp_path):
    """A study killed during its default trial: on resume that trial is failed as interrupted
    (its config not marked bad) and the default runs again first, still the default."""
    first = _study(tmp_path, FakeRuns())
    first._enqueue(first.default(), "default", skip_if_exists=False)
    left = first.study.ask()  # the default, as the killed study took it
    left.set_user_attr("owner", f"{socket.gethostname()}:{os.getpid()}:0.00")  # owner gone
    runs = FakeRuns()
    again = _study(tmp_path, runs)
    dead = again.study.get_trials()[left.number]
    assert dead.state == optuna.trial.TrialState.FAIL and "interrupted" in dead.user_attrs
    row = again.step()
    assert row.role == "default" and row.error is None, row
    assert row.values == again.default()
    assert len(runs.ran) == 1
