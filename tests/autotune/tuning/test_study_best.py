"""The study's best (``autotune.tuning.study_best``): a config measured several times a little
lower outranks a single lucky window, as ``autotune export`` picks."""

import optuna
from optuna.distributions import CategoricalDistribution

from autotune.tuning.study_best import best_trial, config_values


def _study(windows: list[tuple[int, float]]) -> optuna.Study:
    study = optuna.create_study(direction="maximize")
    dist = {"actors": CategoricalDistribution([2, 4])}
    for actors, spj in windows:
        study.add_trial(
            optuna.trial.create_trial(params={"actors": actors}, distributions=dist, value=spj)
        )
    return study


def test_the_best_is_the_config_with_the_best_median_not_its_best_single_window():
    study = _study([(2, 29.8), (2, 36.5), (4, 31.0), (2, 30.1), (4, 31.4)])
    best = best_trial(study)  # 2 actors: median 30.1 and a lucky 36.5; 4 actors: 31.2
    assert best.params == {"actors": 4}
    assert best.value == 31.4  # of its trials the one nearest the median, the latest of equals
    assert sorted(config_values(study, best)) == [31.0, 31.4]


def test_a_tie_goes_to_the_config_measured_more_often_and_no_trial_gives_none():
    assert best_trial(_study([(4, 30.0), (2, 30.0), (2, 30.0)])).params == {"actors": 2}
    assert best_trial(optuna.create_study()) is None
