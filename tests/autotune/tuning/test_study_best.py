"""The study's best (``autotune.tuning.study_best``): a config measured several times a little
lower outranks a single lucky window, as ``autotune export`` picks."""

import optuna
from optuna.distributions import CategoricalDistribution

from autotune.tuning.study_best import best_trial, config_values, unconfirmed_leader


def _study(windows: list[tuple[int, float]]) -> optuna.Study:
    study = optuna.create_study(direction="maximize")
    dist = {"actors": CategoricalDistribution([2, 4])}
    for actors, spj in windows:
        study.add_trial(
            optuna.trial.create_trial(params={"actors": actors}, distributions=dist, value=spj)
        )
    return study


def test_the_best_is_the_config_with_the_best_median_not_the_best_single_window():
    study = _study([(2, 29.8), (2, 30.5), (4, 31.0), (2, 30.1), (2, 30.2)])
    best = best_trial(study)
    assert best.params == {"actors": 2}
    assert best.value in (30.1, 30.2)  # the trial nearest its config's median, 30.15
    assert sorted(config_values(study, best)) == [29.8, 30.1, 30.2, 30.5]
    assert unconfirmed_leader(study).params == {"actors": 4}  # named, to confirm


def test_once_measured_configs_alone_are_ranked_by_their_value():
    study = _study([(2, 29.0), (4, 31.0)])
    assert best_trial(study).params == {"actors": 4}
    assert unconfirmed_leader(study) is None


def test_a_tie_goes_to_the_config_measured_more_often_and_no_trial_gives_none():
    assert best_trial(_study([(4, 30.0), (2, 30.0), (2, 30.0)])).params == {"actors": 2}
    assert best_trial(optuna.create_study()) is None
