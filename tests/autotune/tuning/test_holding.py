"""Holding the best: a best that fails, breaks a constraint or was never measured does not keep
the tuner stuck; a resumed study's values are this job's and its objective's."""

from __future__ import annotations

from dataclasses import replace

import optuna
import pytest
from optuna.trial import TrialState
from test_online_tuner import World, _run, _tuner

from autotune.tuning.storage import StudyError, open_study


def _ticks(tuner, world, n):
    for _ in range(n):
        world.t += 0.5
        tuner.tick()


def test_a_held_best_the_job_now_refuses_gives_way_to_the_next_best(tmp_path):
    world = World(0)
    tuner = _tuner(tmp_path, world, trials=12, recheck_s=10.0)
    _run(tuner, world, 12)
    _ticks(tuner, world, 40)
    refused = tuner.best()["values"]
    world.refuse = dict(refused)
    before = len(world.applied)
    _ticks(tuner, world, 100)  # 50 s: five rechecks' worth
    assert tuner.best()["values"] != refused  # failed for good: never the best again
    assert world.applied[-1] == tuner.best()["values"]
    assert refused not in world.applied[before:]  # tried no more (the refusal is not applied)


class LagWorld(World):
    """A job whose policy lag can be made three times what the world gives."""

    lag_mult = 1.0

    def counters(self):
        before = self.lag
        c = super().counters()
        self.lag += (self.lag - before) * (self.lag_mult - 1)
        return replace(c, lag_steps=self.lag)


def test_a_held_best_that_breaks_the_lag_ceiling_is_dropped_until_it_meets_it(tmp_path):
    world = LagWorld(0)
    tuner = _tuner(tmp_path, world, trials=12, recheck_s=10.0, max_policy_lag=3.5)
    _run(tuner, world, 12)
    _ticks(tuner, world, 40)
    held = tuner.best()["values"]
    world.lag_mult = 3.0  # every config's lag triples: only the slowest stay under 3.5
    _ticks(tuner, world, 600)
    assert tuner.best()["values"] != held
    holds = [w for w in tuner.log if w["state"] == "hold"][-4:]
    assert holds and all(w["feasible"] for w in holds)  # what it holds now meets the ceiling


def test_a_resumed_study_whose_trials_all_were_cut_explores_again(tmp_path):
    study = open_study(f"sqlite:///{tmp_path}/s.db", "s", seed=0)
    for _ in range(30):  # the job ended mid-window each time
        trial = study.ask()
        trial.suggest_categorical("actors", list(range(1, 11)))
        trial.set_user_attr("interrupted", "job ended")
        study.tell(trial, state=TrialState.FAIL)
    world = World(0)
    tuner = _tuner(tmp_path, world, trials=30)
    _ticks(tuner, world, 400)
    assert tuner.unmet is None and tuner.best() is not None
    assert len([w for w in tuner.log if w["state"] == "trial"]) >= 10
    waiting = study.get_trials(states=(TrialState.WAITING,))
    assert not waiting or tuner.current is not None


def test_a_resumed_study_applies_no_value_of_a_knob_fixed_since(tmp_path):
    world = World(0)
    first = _tuner(tmp_path, world, trials=12)
    _run(first, world, 12)
    assert any(v["batch_size"] > 1024 for v in world.applied)

    class FixedBatch(World):  # the job's batch size is 1024 unless a config changes it
        def apply(self, values):
            super().apply({"batch_size": 1024, **values})
            self.applied[-1] = dict(values)

    again = FixedBatch(1)
    fixed = ["batch_size=1024", "envs_per_actor=8", "chunk_bytes=262144"]
    second = _tuner(tmp_path, again, knobs=fixed, trials=16)
    assert second.trials_done == 0  # the first run's trials tuned the batch size too
    _run(second, again, 16)
    _ticks(second, again, 60)
    assert all("batch_size" not in v for v in again.applied)
    assert set(second.best()["values"]) == {"actors"}


def test_a_study_of_another_objective_is_refused_saying_which_it_holds(tmp_path):
    world = World(0)
    _run(_tuner(tmp_path, world, trials=3, objective="steps_per_s"), world, 3)
    with pytest.raises(StudyError, match="holds steps_per_s values and this run's objective"):
        _tuner(tmp_path, World(0), trials=3)
    study = optuna.load_study(study_name="s", storage=f"sqlite:///{tmp_path}/s.db")
    assert study.user_attrs["objective"] == "steps_per_s"


def test_the_incumbents_measuring_again_is_not_pruned_past_the_envs_saturation(tmp_path):
    """Saturation caps envs per actor after the incumbent was first measured past the cap: its
    measuring again still runs, so the best rests on two agreeing windows."""
    from autotune.tuning.counters import Counters

    rate = {(2, 4): 50, (2, 8): 51, (6, 32): 90}  # steps/J (and steps/s / 1000)

    class EnvWorld(World):
        def counters(self):
            dt, self.last = self.t - self.last, self.t
            if self.values and dt > 0:
                key = (self.values["actors"], self.values["envs_per_actor"])
                spj = rate.get(key, 40) * (1 + self.rng.gauss(0, 0.01))
                self.steps += 1000 * spj * dt
                self.joules += 1000 * dt
            return Counters(self.t, int(self.steps), 0.0, 0.0, self.joules)

    knobs = ["envs_per_actor=4,8,16,32", "batch_size=1024", "chunk_bytes=262144"]
    world = EnvWorld(0)
    base = {"actors": 2, "envs_per_actor": 4}
    tuner = _tuner(tmp_path, world, knobs=knobs, base=base, trials=30, sampler="tpe")
    tuner.study.enqueue_trial({"actors": 6, "envs_per_actor": 32})  # the best, measured first
    tuner.study.enqueue_trial({"actors": 2, "envs_per_actor": 8})  # then the cap comes: 8
    _run(tuner, world, 30)
    assert tuner.best()["values"] == {"actors": 6, "envs_per_actor": 32}
    assert tuner.best()["measurements"] >= 2


def test_the_model_sampler_rates_goodput_by_the_samples_of_an_update_as_the_tuner_does():
    """Two GMIs train twice the samples per update: the sampler's incumbent is the tuner's."""
    import json

    from optuna.distributions import CategoricalDistribution

    from autotune.tuning.job import History
    from autotune.tuning.model_inputs import update_samples
    from autotune.tuning.model_sampler import ModelSampler
    from bench.tuner_sim import PROBED
    from policies.noise_scale import goodput_per_joule

    choices = {"actors": tuple(range(1, 17)), "batch_size": (2048, 4096, 8192), "trainers": (1, 2)}
    defaults = {"actors": 8, "envs_per_actor": 8, "batch_size": 4096, "trainer_device": "cuda"}
    defaults |= {"trainers": 1, "mps_pct": 100, "trainer_threads": 1}
    sampler = ModelSampler(
        PROBED, choices, defaults, dict.fromkeys(choices, "live"), "goodput_per_joule", seed=0
    )
    study = optuna.create_study(direction="maximize", sampler=sampler)
    noise, history = 4096.0, History(rerate=True, noise_scale=4096.0)
    for trainers, spj in ((2, 100.0), (1, 80.0)):
        params = {"actors": 8, "batch_size": 4096, "trainers": trainers}
        samples = update_samples({**defaults, **params})
        attrs = {"steps_per_s": spj * 300, "steps_per_joule": spj, "gpu_j": 3000.0}
        attrs |= {"cpu_j": 3000.0, "window_s": 10.0, "policy_lag": 1.0, "noise_scale": noise}
        for _ in range(2):
            trial = optuna.trial.create_trial(
                params=params,
                distributions={k: CategoricalDistribution(choices[k]) for k in params},
                value=goodput_per_joule(spj, noise, samples),
                user_attrs={**attrs, "feasible": True},
            )
            study.add_trial(trial)
            history.add(json.dumps(params, sort_keys=True), trial.value, spj, samples)
    sampler.plan(study)
    assert json.loads(history.best()[0]) == sampler.last["incumbent"]
