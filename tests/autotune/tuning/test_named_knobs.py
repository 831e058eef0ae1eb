"""The model sampler measures a named knob it does not describe (``knobs.OPT_IN``), one untried
value at a time on the incumbent, and fits its model to the incumbent's value of it only."""

from __future__ import annotations

import optuna
from optuna.distributions import CategoricalDistribution

from autotune.tuning.model_sampler import ModelSampler
from autotune.tuning.sizing import size_run
from bench import tuner_sim


def _window(study, params, value):
    """A finished trial as the online tuner leaves one: its window's figures as attributes."""
    dists = {k: CategoricalDistribution(SPACE[k]) for k in params}
    attrs = {"window_s": 10.0, "steps_per_s": 1000.0 * value, "gpu_j": 5000.0, "cpu_j": 5000.0}
    attrs |= {"policy_lag": 1.0, "steps_per_joule": value, "feasible": True}
    trial = optuna.trial.create_trial(
        params=params, distributions=dists, value=value, user_attrs=attrs
    )
    study.add_trial(trial)


space = tuner_sim.build_space(tuner_sim.Machine(16, 1), [*tuner_sim.SPACE, "actor_nice=0,10"])
SPACE = {k.name: k.choices for k in space.values() if k.online}


def test_a_named_knob_the_model_cannot_predict_is_measured_on_the_incumbent():
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    online = {k.name: k for k in space.values() if k.online}
    fixed = {k.name: k.choices[0] for k in space.values() if not k.online}
    sized = size_run(tuner_sim.PROBED, 1, fixed, 4).values
    defaults = {**fixed, **{n: sized.get(n, k.choices[0]) for n, k in online.items()}}
    assert defaults["actor_nice"] == 0
    applies = {k.name: k.apply for k in online.values()}
    s = ModelSampler(tuner_sim.PROBED, SPACE, defaults, applies, seed=0)
    study = optuna.create_study(direction="maximize", sampler=s)
    start = {n: defaults[n] for n in SPACE}
    first = s.plan(study)  # nothing measured: the model's move, the named knob as it is
    assert s.last["chosen"] != "named" and first["actor_nice"] == 0
    _window(study, start, 100.0)
    plan = s.plan(study)  # the incumbent measured: the named knob's other value, all else kept
    assert s.last["chosen"] == "named" and plan == {**start, "actor_nice": 10}
    _window(study, plan, 80.0)  # worse: the model goes on from the incumbent
    plan = s.plan(study)
    assert s.last["chosen"] != "named" and plan["actor_nice"] == 0
    assert s.last["windows"] == 1  # fitted to the incumbent's niceness only
    # had the other value won, the model would go on from it, fitted to its windows
    _window(study, {**start, "actor_nice": 10}, 130.0)
    _window(study, {**start, "actor_nice": 10}, 130.0)
    plan = s.plan(study)
    assert plan["actor_nice"] == 10 and s.last["windows"] == 3
