"""Reference runs: a study's trials scaled to one machine state.

On a shared machine the same config can measure tens of percent apart a few minutes later (the
H100 host of docs/BENCHMARKS.md section 10: the raw env rate moved by up to 25 % between two
runs five minutes apart). A study whose trials run minutes apart then compares machine states
as much as configs. ``autotune study --reference-every K`` re-runs the default config (the
study's first trial, ``role`` "default") after every K other trials, as a trial of ``role``
"reference", and every trial is scaled by the reference measured last before it:

    scaled = raw x (first reference's value / latest reference's value)

so a trial that ran while the machine was 10 % slower than at the study's start counts 10 %
more. The first reference is the default trial itself, so without reference runs every factor
is 1 and the scaled figures equal the raw ones. The raw figures stay in the trial's
``steps_per_s`` and ``steps_per_joule``; the scaled ones are ``scaled_steps_per_s`` and
``scaled_steps_per_joule``, with ``reference_trial`` naming the reference used. The study's
objective, its confirmations, its profiling and ``autotune export`` all rank by the scaled
figures (``score``).

Each process scales by its own references: in a resumed session a process runs a reference of
its own first, and its trials count as their ratio to it, times the study's first reference.
One process runs the study at a time: ``--reference-every`` is refused with ``--workers``, and
workers on other hosts sharing the storage would each scale by references of their own against
a first reference none of them shares the machine state of. References count against
``--trials``; none runs among the confirmations, unless the session has none yet. A reference
that fails stops them for the session (its config is not marked unrunnable for that).

This corrects drift over minutes, not the jitter between two adjacent windows: a single
reference run carries that jitter into every trial it scales. Use it where the references
themselves drift (the export's ``reference_runs`` shows their spread).
"""

from __future__ import annotations

from typing import Any

from optuna.trial import TrialState

REFERENCE_ROLES = ("default", "reference")
"""Roles of the trials that measure the default config as a reference."""
METRICS = ("steps_per_s", "steps_per_joule")
GOODPUT_METRIC = "goodput_per_joule"
"""A goodput study (``--objective goodput_per_joule``) maximises this: a trial's steps/J times
the statistical efficiency of its batch at the gradient noise scale its learner measured
(``policies.noise_scale``); reference runs scale it as they scale steps/J."""
TARGET_METRIC = "target_per_mj"
"""A study to a target return (``--objective joules_to_target``) maximises this: 1e6 over the
joules a trial took to reach the target, 0 for one that did not. It counts whole runs, start-up
included, and is not scaled by reference runs."""


def scaled_name(metric: str) -> str:
    return f"scaled_{metric}"


def score(trial: Any, metric: str) -> float | None:
    """A completed trial's figure to rank by: its scaled ``metric``, or the raw one for trials
    measured before scaling existed."""
    value = trial.user_attrs.get(scaled_name(metric))
    return trial.user_attrs.get(metric) if value is None else value


def _is_reference(trial: Any) -> bool:
    return trial.user_attrs.get("role") in REFERENCE_ROLES


def _running_or_done(trial: Any) -> bool:
    return trial.state in (TrialState.COMPLETE, TrialState.RUNNING)


def reference_due(trials: list[Any], every: int, owner: str, confirm: bool = False) -> bool:
    """Whether this process (``owner``, the trials' ``owner`` attribute) should run a reference
    next: ``every`` > 0, the default trial exists (it comes first and is the first reference),
    and this process has no reference yet (a resumed session) or, unless the next trial is a
    confirmation (``confirm``), has asked at least ``every`` trials since its last one (failed
    trials count: they took the machine's time too; a failed or interrupted reference does
    not)."""
    if every <= 0 or not any(_is_reference(t) and _running_or_done(t) for t in trials):
        return False
    mine = [t for t in trials if t.user_attrs.get("owner") == owner]
    refs = [t.number for t in mine if _is_reference(t) and _running_or_done(t)]
    if not refs:
        return True
    return not confirm and sum(t.number > max(refs) for t in mine) >= every


Figures = dict[str, Any]


def scale(
    trials: list[Any],
    number: int,
    owner: str | None,
    unit: str | None = None,
    own: Figures | None = None,
) -> tuple[int | None, dict[str, float]]:
    """The reference for trial ``number`` and each metric's factor.

    The factor is first reference / latest reference: the study's first completed reference,
    and the latest completed one of this process (``owner``) before ``number``, or, for a
    reference trial (``own``: its raw figures), itself. A reference of another process ran on
    another slice of the cores or another host, or in another session, so it does not scale
    this one's trials. Only references scored in the same ``unit`` count (a wrapped script's
    run that reported no steps is scored per run). A factor is 1 where a figure is missing or 0,
    and every factor is 1 (reference None) where this process has no reference yet.
    """
    refs = sorted(
        (
            t
            for t in trials
            if t.state == TrialState.COMPLETE
            and _is_reference(t)
            and t.number < number
            and t.user_attrs.get("unit") == unit
        ),
        key=lambda t: t.number,
    )
    mine = [t for t in refs if t.user_attrs.get("owner") == owner]
    if own is not None:
        first, latest, ref = (refs[0].user_attrs if refs else own), own, number
    elif mine:
        first, latest, ref = refs[0].user_attrs, mine[-1].user_attrs, mine[-1].number
    else:
        return None, {m: 1.0 for m in METRICS}
    factors = {}
    for m in METRICS:
        a, b = first.get(m), latest.get(m)
        factors[m] = a / b if a and b else 1.0
    return ref, factors


def reference_runs(trials: list[Any], metric: str) -> dict[str, Any] | None:
    """The raw figures of the completed reference runs (the default included): how far the
    machine drifted during the study; None without any."""
    values = [
        t.user_attrs[metric]
        for t in trials
        if t.state == TrialState.COMPLETE
        and _is_reference(t)
        and t.user_attrs.get(metric) is not None
    ]
    if not values:
        return None
    return {
        "count": len(values),
        "min": min(values),
        "max": max(values),
        "spread": max(values) / min(values) if min(values) > 0 else None,
    }
