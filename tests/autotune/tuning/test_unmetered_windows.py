"""The online tuner's windows when the meters read nothing: a window with steps but no metered
energy has no rate per joule, so it goes on; a config never metered is failed, not rated 0."""

from __future__ import annotations

import optuna

from tests.autotune.tuning.test_online_tuner import BEST, World, _run, _tuner


def test_a_window_with_steps_but_no_metered_energy_is_not_rated_zero(tmp_path):
    """The meters read nothing for the first 7 s (a window's ceiling is 5): the first window
    goes on until they move and is rated by what they read then; a config they never meter
    is failed, not told to the study as 0 steps/J."""
    world = World(0, dark=3, meter_from=7.0)
    tuner = _tuner(tmp_path, world)
    _run(tuner, world, 30)
    rated = [w for w in tuner.log if w["state"] == "trial"]
    assert rated and all(w["objective"] > 0 for w in rated)
    assert rated[0]["window_s"] > 5.0
    failed = tuner.study.get_trials(states=(optuna.trial.TrialState.FAIL,))
    errors = {t.params["actors"]: t.user_attrs["error"] for t in failed if "error" in t.user_attrs}
    assert "no energy metered over 15 s of training" in errors[3]
    assert tuner.best()["values"] == BEST
