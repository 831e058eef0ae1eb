"""Two of the model sampler's rules: once a minute of windows is measured it does not try a
config predicted far below the incumbent; and it measures a named knob it does not describe
(``knobs.OPT_IN``), one untried value at a time on the incumbent, fitting its model to the
incumbent's value of it only."""

from __future__ import annotations

import optuna
from optuna.distributions import CategoricalDistribution

from autotune.tuning.model_sampler import ModelSampler
from autotune.tuning.sizing import size_run
from bench import tuner_sim


def _window(study, params, value, window_s=10.0):
    """A finished trial as the online tuner leaves one: its window's figures as attributes."""
    dists = {k: CategoricalDistribution(NAMED[k]) for k in params}
    joules = 1000.0 * window_s  # 100 W a side
    attrs = {"window_s": window_s, "steps_per_s": joules * value / window_s}
    attrs |= {"gpu_j": joules, "cpu_j": joules}
    attrs |= {"policy_lag": 1.0, "steps_per_joule": value, "feasible": True}
    trial = optuna.trial.create_trial(
        params=params, distributions=dists, value=value, user_attrs=attrs
    )
    study.add_trial(trial)


def _space(extra=()):
    return tuner_sim.build_space(tuner_sim.Machine(16, 1), [*tuner_sim.SPACE, *extra])


NAMED = {k.name: k.choices for k in _space(["actor_nice=0,10"]).values() if k.online}


def _sampler(extra=(), **kw):
    """A model sampler over tuner_sim's knobs and ``extra`` ones, its study and defaults."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    space = _space(extra)
    online = {k.name: k for k in space.values() if k.online}
    fixed = {k.name: k.choices[0] for k in space.values() if not k.online}
    sized = size_run(tuner_sim.PROBED, 1, fixed, 4).values
    defaults = {**fixed, **{n: sized.get(n, k.choices[0]) for n, k in online.items()}}
    applies = {k.name: k.apply for k in online.values()}
    choices = {k.name: k.choices for k in online.values()}
    s = ModelSampler(tuner_sim.PROBED, choices, defaults, applies, seed=0, **kw)
    return s, optuna.create_study(direction="maximize", sampler=s), defaults


def test_after_a_minute_of_windows_no_config_predicted_far_below_the_incumbent_is_tried():
    """The incumbent measured far above anything the model predicts: in its first 45 s of
    windows the sampler may still explore; after them, only a config the model cannot rate
    (uncertainty over ``unsure``) may go below 0.7 of the incumbent: here none can."""
    for window_s, cautious in ((20.0, False), (50.0, True)):
        s, study, defaults = _sampler(unsure=1e9)
        start = {n: defaults[n] for n in s.choices}
        _window(study, start, 5_000.0, window_s)  # 50x what the model predicts anywhere
        plan = s.plan(study)
        assert s.last["cautious"] is cautious
        if cautious:
            assert s.last["candidates"] == 0 and s.last["chosen"] == "incumbent"
            assert plan == start
        else:
            assert s.last["candidates"] > 0
    # a config the model cannot rate may still be tried: with the default ``unsure`` some are
    s, study, defaults = _sampler()
    _window(study, {n: defaults[n] for n in s.choices}, 5_000.0, 50.0)
    s.plan(study)
    assert s.last["cautious"] and s.last["candidates"] > 0


def test_a_named_knob_the_model_cannot_predict_is_measured_on_the_incumbent():
    s, study, defaults = _sampler(["actor_nice=0,10"])
    assert defaults["actor_nice"] == 0
    start = {n: defaults[n] for n in s.choices}
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


def _ended(study, params, state, error=None):
    """A trial the tuner ended without a window: pruned, or failed with ``error``."""
    dists = {k: CategoricalDistribution(NAMED[k]) for k in params}
    attrs = {"error": error} if error else {}
    trial = optuna.trial.create_trial(
        params=params, distributions=dists, state=state, user_attrs=attrs
    )
    study.add_trial(trial)


def test_a_named_value_pruned_or_refused_is_not_suggested_again():
    """A named config the tuner pruned (its envs past saturation) counts as tried, so the
    sampler goes on to its model; a value the job refused is not tried on the next incumbent
    either (EnvPool not installed fails on every config)."""
    s, study, defaults = _sampler(["actor_nice=0,10"])
    start = {n: defaults[n] for n in s.choices}
    _window(study, start, 100.0)
    _ended(study, {**start, "actor_nice": 10}, optuna.trial.TrialState.PRUNED)
    s.plan(study)
    assert s.last["chosen"] != "named"
    s, study, defaults = _sampler(["actor_nice=0,10"])
    _window(study, start, 100.0)
    _ended(study, {**start, "actor_nice": 10}, optuna.trial.TrialState.FAIL, error="refused")
    other = {**start, "batch_size": start["batch_size"] * 2}  # a new incumbent
    _window(study, other, 150.0)
    _window(study, other, 150.0)
    plan = s.plan(study)
    assert s.last["chosen"] != "named" and plan["actor_nice"] == 0


def test_a_start_value_outside_a_knobs_choices_is_held_at_its_nearest_choice():
    """A knob the plan does not move keeps the start's value; where the start lies outside
    the knob's choices (``--knob`` narrowed them), the plan holds the nearest choice (the
    fewer cores of two as near) instead of leaving Optuna to draw one at random."""
    from autotune.tuning.model_sampler import nearest

    assert nearest(1, (2, 4)) == 2 and nearest(3, (2, 4)) == 2 and nearest(4, (2, 4)) == 4
    assert nearest("cuda", ("cpu",)) == "cpu" and nearest([25, 50], (25, 50)) == 25
    s, study, _ = _sampler()
    name = next(n for n, c in s.choices.items() if len(c) > 1 and isinstance(c[0], int))
    s.defaults[name] = max(s.choices[name]) + 1000  # outside the choices
    for _ in range(3):
        trial = study.ask()
        for n, c in s.choices.items():
            trial.suggest_categorical(n, c)
        assert trial.params == s._plans[trial.number]  # every value the plan's, none drawn
        study.tell(trial, 1.0)
