"""The online tuner's windows when the meters read nothing: a window with steps but no metered
energy has no rate per joule, so it goes on; a config never metered is failed, not rated 0,
and marked bad only once it has gone unmetered twice (the first may be the meter's gap)."""

from __future__ import annotations

import optuna

from autotune.control.status import _note
from autotune.tuning.storage import config_key, failed_configs, trial_values
from tests.autotune.tuning.test_online_tuner import BEST, World, _run, _tuner

DARK = {**BEST, "actors": 3}


def _dark_fails(tuner) -> list:
    fails = tuner.study.get_trials(states=(optuna.trial.TrialState.FAIL,))
    return [t for t in fails if t.params == DARK]


def test_a_window_with_steps_but_no_metered_energy_is_not_rated_zero(tmp_path):
    """The meters read nothing for the first 7 s (a window's ceiling is 5): the first window
    goes on until they move and is rated by what they read then; a config they never meter
    is failed, not told to the study as 0 steps/J, and after its second try not tried again."""
    world = World(0, dark=3, meter_from=7.0)
    tuner = _tuner(tmp_path, world)
    for _ in range(3):
        tuner.study.enqueue_trial(DARK)
    _run(tuner, world, 30)
    rated = [w for w in tuner.log if w["state"] == "trial"]
    assert rated and all(w["objective"] > 0 for w in rated)
    assert rated[0]["window_s"] > 5.0
    dark = _dark_fails(tuner)
    assert "no energy metered over 15 s of training" in dark[0].user_attrs["unmetered"]
    assert "error" not in dark[0].user_attrs  # not marked bad: tried again
    assert _note(dark[0]).endswith("no energy metered over 15 s of training (tried once more)")
    assert "no energy metered over 15 s of training" in dark[1].user_attrs["error"]
    assert [t.user_attrs.get("skipped") for t in dark[2:]] == [
        "this config failed before; not tried again"
    ] * len(dark[2:])
    assert config_key(trial_values(dark[0])) in failed_configs(tuner.study)
    assert tuner.best()["values"] == BEST


def test_a_config_the_meter_missed_once_is_measured_again_and_rated(tmp_path):
    """The meters read nothing while a config's first try is measured (a gap), and read
    again by its second: it is rated, and not refused for good."""
    world = World(0, dark=3)
    tuner = _tuner(tmp_path, world)
    tuner.study.enqueue_trial(DARK)
    while not _dark_fails(tuner):
        assert world.t < 600, "the config's first try was never measured"
        world.t += 0.5
        tuner.tick()
    world.dark = None  # the meter is back; the config is tried again by itself, next
    _run(tuner, world, tuner.trials_done + 1)
    rated = [w for w in tuner.log if w["state"] == "trial" and w["values"] == DARK]
    assert len(rated) == 1 and rated[0]["objective"] > 0, tuner.log
    assert config_key(trial_values(_dark_fails(tuner)[0])) not in failed_configs(tuner.study)


def test_a_recheck_of_the_best_config_the_meter_missed_marks_nothing_bad(tmp_path):
    """Holding the best config after its trials, the meters go dark for a recheck: the
    incumbent, metered before, is not marked bad; it is measured again later and rated."""
    world = World(0)
    tuner = _tuner(tmp_path, world, trials=8, recheck_s=10.0)
    _run(tuner, world, 8)
    best = tuner.best()["values"]
    world.dark = best["actors"]
    checks = len([w for w in tuner.log if w["state"] != "trial"])
    for _ in range(400):  # the recheck's windows, until it gives up on this one
        world.t += 0.5
        tuner.tick()
    assert config_key(best) not in tuner.history.failed
    world.dark = None
    for _ in range(400):
        world.t += 0.5
        tuner.tick()
    rechecks = [w for w in tuner.log if w["state"] != "trial"]
    assert len(rechecks) > checks and rechecks[-1]["objective"] > 0, rechecks
    assert tuner.best()["values"] == best
