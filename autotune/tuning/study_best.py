"""The best of a study's completed trials, as its summary and ``autotune export`` name them: for
one objective, the config with the best median over its trials (not the single best trial:
a lucky window of a config measured several times does not speak for it alone), and how many
trials that rests on, so a pick measured once is said to be (``autotune study --confirm``
measures leaders again). For several objectives, the Pareto front."""

from __future__ import annotations

import statistics
from collections.abc import Callable
from typing import TypeVar

import optuna
from optuna.trial import TrialState

from autotune.tuning.storage import config_key, trial_values

T = TypeVar("T")


def pick_config(groups: dict[str, list[T]], value: Callable[[T], float]) -> list[T]:
    """The trials of the best config measured (``groups``: each config's trials, none empty):
    the highest median ``value``, more trials winning a tie."""
    return max(groups.values(), key=lambda ts: (statistics.median(value(t) for t in ts), len(ts)))


def best_trial(
    study: optuna.Study,
    metric: int = 0,
    run_of: Callable[[optuna.trial.FrozenTrial], str] | None = None,
) -> optuna.trial.FrozenTrial | None:
    """A completed trial of the best config (``pick_config`` on objective ``metric``'s value; 0:
    the first or only one): of its trials, the one nearest their median, the latest of
    equals. ``run_of``: what makes two trials one config's runs (default: their knob values;
    a wrapped script's study adds the command, which a resumed study may have changed). None
    without a completed trial."""
    groups = _groups(study, run_of)
    if not groups:
        return None
    best = pick_config(groups, lambda t: t.values[metric])
    mid = statistics.median(t.values[metric] for t in best)
    return min(reversed(best), key=lambda t: abs(t.values[metric] - mid))


def command_run(trial: optuna.trial.FrozenTrial) -> str:
    """A wrapped script's config as one command ran it (``best_trial``'s ``run_of``): a study
    resumed with another command holds runs of each, which are not pooled."""
    return config_key({"cmd": trial.user_attrs.get("cmd"), "values": trial_values(trial)})


def _groups(
    study: optuna.Study, run_of: Callable[[optuna.trial.FrozenTrial], str] | None = None
) -> dict[str, list[optuna.trial.FrozenTrial]]:
    key = run_of or (lambda t: config_key(trial_values(t)))
    groups: dict[str, list[optuna.trial.FrozenTrial]] = {}
    for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
        groups.setdefault(key(t), []).append(t)
    return groups


def config_values(
    study: optuna.Study, trial: optuna.trial.FrozenTrial, metric: int = 0
) -> list[float]:
    """Objective ``metric``'s values over the completed trials of ``trial``'s config."""
    key = config_key(trial_values(trial))
    done = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    return [t.values[metric] for t in done if config_key(trial_values(t)) == key]


def pareto_front(study: optuna.Study) -> list[optuna.trial.FrozenTrial]:
    """The completed trials no other completed trial beats on every objective (all of them
    maximised), in trial order; for one objective, the best trial."""
    done = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))

    def beaten(t: optuna.trial.FrozenTrial) -> bool:
        return any(
            all(a >= b for a, b in zip(o.values, t.values, strict=True)) and o.values != t.values
            for o in done
        )

    return [t for t in done if not beaten(t)]
