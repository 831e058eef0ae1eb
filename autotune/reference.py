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

This corrects drift over minutes, not the jitter between two adjacent windows: a single
reference run carries that jitter into every trial it scales. Use it where the references
themselves drift (the export's ``reference_runs`` shows their spread).
"""

from __future__ import annotations

from typing import Any

REFERENCE_ROLES = ("default", "reference")
"""Roles of the trials that measure the default config as a reference."""
METRICS = ("steps_per_s", "steps_per_joule")


def scaled_name(metric: str) -> str:
    return f"scaled_{metric}"


def score(trial: Any, metric: str) -> float | None:
    """A completed trial's figure to rank by: its scaled ``metric``, or the raw one for trials
    measured before scaling existed."""
    value = trial.user_attrs.get(scaled_name(metric))
    return trial.user_attrs.get(metric) if value is None else value


def _is_reference(trial: Any) -> bool:
    return trial.user_attrs.get("role") in REFERENCE_ROLES


def reference_due(trials: list[Any], every: int) -> bool:
    """Whether the next trial should be a reference run: ``every`` > 0, a default trial exists,
    and at least ``every`` trials were asked since the last reference (failed ones count: they
    took the machine's time too)."""
    if every <= 0:
        return False
    numbers = [t.number for t in trials if _is_reference(t)]
    if not numbers:
        return False  # the default trial comes first and is the first reference
    return sum(t.number > max(numbers) for t in trials) >= every


Figures = dict[str, Any]


def scale(trials: list[Any], number: int,
          own: Figures | None = None) -> tuple[int | None, dict[str, float]]:  # fmt: skip
    """The reference for trial ``number`` and each metric's factor (first reference / that one;
    1 where either is missing or zero). The reference is the completed one with the highest
    number below ``number``, or, for a reference trial (``own``: its raw figures), itself."""
    from optuna.trial import TrialState

    refs = sorted((t for t in trials if t.state == TrialState.COMPLETE and _is_reference(t)
                   and t.number < number), key=lambda t: t.number)  # fmt: skip
    if own is not None:
        first, latest, ref = (refs[0].user_attrs if refs else own), own, number
    elif refs:
        first, latest, ref = refs[0].user_attrs, refs[-1].user_attrs, refs[-1].number
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
    from optuna.trial import TrialState

    values = [t.user_attrs[metric] for t in trials
              if t.state == TrialState.COMPLETE and _is_reference(t)
              and t.user_attrs.get(metric) is not None]  # fmt: skip
    if not values:
        return None
    return {"count": len(values), "min": min(values), "max": max(values),
            "spread": max(values) / min(values) if min(values) > 0 else None}  # fmt: skip
