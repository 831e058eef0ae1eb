"""Small decisions of the online tuner (``autotune.tuning.online_tuner``), kept apart so each
reads on its own: how long a change warms up, when a best is confirmed, what is in the space,
whether the start config is measured first."""

from __future__ import annotations

import contextlib
from typing import Any

import optuna

from autotune.tuning.knobs import Knob
from autotune.tuning.storage import StudyError, config_key

CHANGE_COST_S = {"respawn": 10.0, "handover": 15.0, "actors": 5.0, "live": 0.0}
"""Seconds a change costs (its transition and warm-up), by how it applies, until the job has
measured its own (``change_costs``)."""
AGREE = 0.1
"""Two measurements of a config agree when they differ by at most this share."""
PAYBACK = 2.0
"""A trial is started only while the job has at least this many trials' worth of time left:
the trial itself, then as long again to run what it found."""


def change_warmup(
    knobs: list[Knob], before: dict[str, Any], values: dict[str, Any], warmup_s: float
) -> float:
    """Warm-up for a change from ``before`` to ``values``: ``warmup_s`` if it starts processes
    (actors respawned or added, GMIs handed over, or the first config), else none: the
    running processes take a batch or chunk size as it comes, and the tuner starts measuring
    once the job says the change took effect."""
    for knob in knobs:
        old, new = before.get(knob.name), values.get(knob.name)
        if old == new:
            continue
        if knob.apply in ("respawn", "handover") or knob.name == "actors" or old is None:
            return warmup_s
    return 0.0


def change_kind(
    applies: dict[str, str], before: dict[str, Any], values: dict[str, Any]
) -> str | None:
    """How a change from ``before`` to ``values`` applies, the costliest way of the knobs it
    moves (``applies``: each knob's ``Knob.apply``; a new actor count is ``actors``); None
    when it moves none, or when nothing was applied before (the tuner's first config)."""
    if not before:
        return None
    kinds = change_kinds(applies, before, values)
    return max(kinds, key=lambda k: CHANGE_COST_S.get(k, 0.0)) if kinds else None


def change_kinds(
    applies: dict[str, str], before: dict[str, Any], values: dict[str, Any]
) -> set[str]:
    """Every way a change from ``before`` to ``values`` applies, one per knob it moves
    (``applies``: each knob's ``Knob.apply``; a new actor count is ``actors``)."""
    return {
        "actors" if n == "actors" else how
        for n, how in applies.items()
        if before.get(n) != values.get(n)
    }


def change_costs(trials: list[Any]) -> dict[str, float]:
    """Seconds a change costs by how it applies: ``CHANGE_COST_S``, with the median of what
    this job's own changes of each kind measured from being applied to their window's start
    (trials' ``change`` attribute: its kind and seconds; a hand-over from a spare GMI process
    costs less than one that starts a GMI afresh)."""
    seen: dict[str, list[float]] = {}
    for t in trials:
        change = t.user_attrs.get("change")
        if isinstance(change, dict) and isinstance(change.get("s"), int | float):
            seen.setdefault(str(change.get("kind")), []).append(float(change["s"]))
    costs = dict(CHANGE_COST_S)
    for kind, s in seen.items():
        if kind in costs:
            costs[kind] = sorted(s)[len(s) // 2]
    return costs


def confirmed(values: list[float]) -> bool:
    """Whether a config's measurements agree enough for it to be held as the best: two within
    ``AGREE`` of each other, or three or more (their median decides)."""
    if len(values) >= 3:
        return True
    return len(values) == 2 and abs(values[0] - values[1]) <= AGREE * max(values)


def in_space(knobs: list[Knob], values: dict[str, Any]) -> bool:
    """Whether every value is one of its knob's choices (a job started outside the space the
    user narrowed, or a best from an older, wider space, cannot be enqueued)."""
    return all(k.name not in values or values[k.name] in k.choices for k in knobs)


def start_due(trials: list[Any], base: dict[str, Any], failed: set[str]) -> bool:
    """Whether the start config ``base`` is to be enqueued first: no trial of it measured,
    waiting, running or pruned, and it has not failed for good (``failed``: config keys). A trial
    of it cut before its window ended (the job ended, the tuner died) does not count: a resumed
    study measures it first, so it stays the first window, the yardstick a ``weighted``
    objective rates every other by."""
    if config_key(base) in failed:
        return False
    counted = ("COMPLETE", "WAITING", "RUNNING", "PRUNED")
    return not any(
        t.state.name in counted
        and config_key(t.system_attrs.get("fixed_params", t.params)) == config_key(base)
        for t in trials
    )


def endgame(remaining_s: float | None, trial_s: list[float]) -> bool:
    """Whether too little of the job is left for another trial to pay back: less than
    ``PAYBACK`` times the median trial so far, from its change being applied to its window's
    end (so a GMI hand-over's start-up and settling count, not only the nominal warm-up). The
    tuner then holds its best config to the end. False when the job's end is unknown or no
    trial has been measured yet."""
    if remaining_s is None or not trial_s:
        return False
    return remaining_s < PAYBACK * sorted(trial_s)[len(trial_s) // 2]


def suggest(knobs: list[Knob], trial: Any) -> dict[str, Any]:
    """A trial's values of ``knobs`` (an ``optuna.trial.Trial``); a CPU trainer has no MPS
    share, so that knob does not exist in its branch."""
    values: dict[str, Any] = {}
    for knob in knobs:
        if knob.name == "mps_pct" and values.get("trainer_device", "cuda") == "cpu":
            continue
        values[knob.name] = trial.suggest_categorical(knob.name, list(knob.choices))
    return values


def unmet_message(settings: Any, speed: dict[str, list[float]], trials: int) -> str:
    """Why tuning stopped with no best: no config met the constraints, or none was measured."""
    if not speed:
        return (
            f"no config was measured in {trials} trials: each failed, was refused or was cut; "
            "back to the default config, tuning stopped"
        )
    fastest = max((max(v) for v in speed.values()), default=0.0)
    return (
        f"no config met the constraints in {trials} trials (floor "
        f"{settings.min_steps_per_s} steps/s, lag ceiling {settings.max_policy_lag}; fastest "
        f"seen {fastest:,.0f} steps/s); back to the default config, tuning stopped"
    )


def fail_quietly(study: optuna.Study, trial: optuna.trial.Trial) -> None:
    """Tells ``trial`` failed where it can (an error is on its way up already)."""
    with contextlib.suppress(Exception):
        study.tell(trial, state=optuna.trial.TrialState.FAIL)


OBJECTIVE_ATTR = "objective"
"""The study attribute an online study records its trials' objective in."""


def objective_problem(study: optuna.Study, objective: str) -> str | None:
    """Why ``study`` cannot take trials of ``objective``: its trials' values are of another
    (steps/s beside steps/J would be compared as one figure), or None."""
    made = study.user_attrs.get(OBJECTIVE_ATTR)
    if made is None or made == objective:
        return None
    return (
        f"study {study.study_name!r} holds {made} values and this run's objective is "
        f"{objective}: give --objective {made} to go on with it, or another --study name"
    )


def check_objective(study: optuna.Study, objective: str) -> None:
    """Refuses ``study`` where it holds another objective's values; records ``objective``
    where it records none.

    Raises:
        StudyError: saying which objective the study holds and what to do.
    """
    problem = objective_problem(study, objective)
    if problem is not None:
        raise StudyError(problem)
    if OBJECTIVE_ATTR not in study.user_attrs:
        study.set_user_attr(OBJECTIVE_ATTR, objective)
