"""The ``weighted`` objective under the model sampler (the default of ``train --tune``): it rates
its predictions as the tuner rates windows, relative to the study's first window, so a
weighted run tunes instead of failing after its probes."""

from __future__ import annotations

import optuna
import pytest
from optuna.distributions import CategoricalDistribution

from autotune.tuning.counters import Measurement
from autotune.tuning.model_sampler import ModelSampler, sampler_for
from autotune.tuning.online_tuner import OnlineTuner
from autotune.tuning.settings import TunerSettings, objective_value
from autotune.tuning.sizing import size_run
from bench import tuner_sim


def _setup():
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    space = tuner_sim.build_space(tuner_sim.Machine(16, 1), tuner_sim.SPACE)
    online = {k.name: k for k in space.values() if k.online}
    fixed = {k.name: k.choices[0] for k in space.values() if not k.online}
    sized = size_run(tuner_sim.PROBED, 1, fixed, 4).values
    base = {n: sized.get(n, k.choices[0]) for n, k in online.items()}
    return space, online, base, {**fixed, **base}


def _figures(steps_per_s: float, steps_per_joule: float) -> Measurement:
    return Measurement(steps_per_s, steps_per_joule, 0.0, 0.0, 0.0, 1.0)


def test_the_model_sampler_tunes_a_weighted_objective_of_the_simulated_job():
    """The real tuner on the simulated job, ``weighted`` with the model sampler: every trial is
    rated relative to the first, and the trials after the first are the model's plans."""
    space, _, base, defaults = _setup()
    settings = TunerSettings(objective="weighted", warmup_s=3.0, window_s=5.0, trials=8)
    sampler = sampler_for(tuner_sim.PROBED, space, defaults, settings, seed=0)
    study = optuna.create_study(direction="maximize", sampler=sampler)
    clock = [0.0]
    job = tuner_sim.SimJob(0, clock)
    tuner = OnlineTuner(study, space, job, settings, base, lambda: clock[0], defaults)
    while tuner.trials_done < settings.trials:
        clock[0] += 0.5
        tuner.tick()
    done = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    assert len(done) >= 6 and done[0].params == base
    first = _figures(done[0].user_attrs["steps_per_s"], done[0].user_attrs["steps_per_joule"])
    for t in done:
        m = _figures(t.user_attrs["steps_per_s"], t.user_attrs["steps_per_joule"])
        assert t.value == pytest.approx(objective_value(settings, m, first))
    assert sampler.last["windows"] >= 5 and sampler.last["chosen"] in ("model", "incumbent")


CHOICES = {k.name: k.choices for k in _setup()[1].values()}


def _study(sampler, objective, weight, windows):
    """A study of measured ``windows`` ((params, steps/s, steps/J), 20 s each), each rated as
    the tuner rates it for ``objective``."""
    study = optuna.create_study(direction="maximize", sampler=sampler)
    settings = TunerSettings(objective=objective, weight=weight)
    ref = None
    for params, sps, spj in windows:
        m = _figures(sps, spj)
        ref = ref or m
        attrs = {"window_s": 20.0, "steps_per_s": sps, "steps_per_joule": spj}
        attrs |= {"gpu_j": 20.0 * sps / spj / 2, "cpu_j": 20.0 * sps / spj / 2, "policy_lag": 1.0}
        dists = {k: CategoricalDistribution(CHOICES[k]) for k in params}
        value = objective_value(settings, m, ref)
        study.add_trial(
            optuna.trial.create_trial(
                params=params, distributions=dists, value=value, user_attrs=attrs
            )
        )
    return study


@pytest.mark.parametrize("weight,alone", [(1.0, "steps_per_s"), (0.0, "steps_per_joule")])
def test_a_weighted_plan_at_either_end_is_the_plan_for_that_figure_alone(weight, alone):
    """All weight on steps/s (or none) plans what a steps/s (steps/J) study plans: the weighted
    predictions are relative to the same first window as the measured values, so the model's
    ranking, its caution and its gains match; with another reference they would not."""
    _, online, base, defaults = _setup()
    applies = {k.name: k.apply for k in online.values()}
    start = {n: base[n] for n in CHOICES}
    fewer = {**start, "actors": start["actors"] // 2}

    def rates(values, by=1.0):  # the simulated job's, for long enough that caution applies
        sps, gpu_w, cpu_w, _ = tuner_sim.true_rates({**defaults, **values})
        return values, by * sps, by * sps / (gpu_w + cpu_w)

    windows = [rates(start), rates(fewer), rates(start, 1.02)]
    plans = {}
    for objective, w in (("weighted", weight), (alone, 0.5)):
        s = ModelSampler(tuner_sim.PROBED, CHOICES, defaults, applies, objective, seed=0, weight=w)
        plans[objective] = (s.plan(_study(s, objective, w, windows)), s.last)
    (weighted, wlast), (plain, plast) = plans["weighted"], plans[alone]
    assert wlast["cautious"] and wlast["chosen"] == plast["chosen"] == "model"
    assert weighted == plain and wlast["candidates"] == plast["candidates"]
