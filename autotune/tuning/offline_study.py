"""``autotune study``: many short runs, one fresh run per trial, on an Optuna study.

A trial is a whole new run, so every knob can move, the ones that need a new run included
(rollout length, inference placement). Two kinds of trial share the study logic here:

* ``TrainTrials``: an ``autotune train`` run of ``trial_s`` seconds, measured from its timeline
  from ``warmup_s`` after its first trained step (start-up and the first updates left out), so
  trials compare fairly. A config the runtime refuses (``TrainConfig.validate``) fails as "not
  runnable" and is never tried again.
* ``ScriptTrials``: a run of a wrapped script (``autotune study -- CMD``, ``autotune wrap``),
  measured by ``autotune.wrap.wrapper.Wrapper``.

The order of trials in a study:

1. the default config (``role`` "default"), the yardstick ``autotune export`` compares with:
   the base config's values, each the nearest of its knob's choices; or, for a base config
   the user gave (``from_config``: ``autotune study --from``), that config as it is. Its
   values that lie outside their knob's choices (``envs_per_actor`` 3 where the knob tries
   powers of two, a ``trainer_threads`` the knob does not try, an MPS share per GMI) are then
   run as given (``given_values``): the trial keeps them in its ``given`` attribute and
   suggests only the other knobs, so Optuna never sees a value outside a knob's choices and
   the study stays valid;
2. GMI-DRL's profiling-based exploration (``role`` "profile", train trials only): for each
   count of trainer GMIs, ascending, environments per actor ascending, with every actor slot
   filled; a row stops at saturation, the first point that gains less than ``SATURATION`` over
   the best of its row, and configs that cannot run are skipped;
3. the sampler (TPE, ``role`` "sampler") over the whole space, seeded by what came before;
4. with ``--confirm K``, the session's last K trials re-measure the leaders (``role``
   "confirm"): of the ``CONFIRM_TOP`` configs with the best medians, the one measured fewest
   times (the better one on a tie). On a shared machine one short trial can be lucky by tens of
   percent; ``autotune export`` picks by the median of a config's trials, so a lucky single
   trial is measured again before it can be recommended;
5. with ``--reference-every K``, first in each session and then after every K trials of this
   process the default config runs again (``role`` "reference", before a planned or sampled
   trial; among the confirmations only as the session's first), and every trial is ranked by
   its figures scaled to the machine state of the study's first reference
   (``autotune.tuning.reference``).

Single objective (steps/J or steps/s), or both (``both``: a multi-objective study whose
Pareto front ``pareto_front`` gives), or goodput per joule (``goodput_per_joule``: steps/J
times the statistical efficiency of the batch at the measured gradient noise scale), or the
joules to a target return (``joules_to_target``:
each trial runs until its 100-episode mean return reaches the base config's ``target_return``,
or its wall limit; ranked by ``TARGET_METRIC``, 1e6 over those joules, 0 short of it).
Every trial keeps every knob's value it ran with (the fixed ones too, which a worker on
fewer cores may fix otherwise than the study's first session) in its ``values`` attribute:
what ``autotune export`` recommends from, and what its failures are remembered by.
The study is in RDB storage and resumes where it stopped,
profiling included; a trial cut by Ctrl-C is failed as interrupted and its config may run
again.
"""

from __future__ import annotations

import logging
import statistics
from typing import Any

from optuna.trial import TrialState

from autotune.tuning.knobs import Knob, knob_value
from autotune.tuning.reference import (
    GOODPUT_METRIC,
    METRICS,
    REFERENCE_ROLES,
    TARGET_METRIC,
    reference_due,
    scale,
    scaled_name,
    score,
)
from autotune.tuning.storage import (
    ask,
    config_key,
    fail_config,
    fail_interrupted,
    fail_orphans,
    failed_configs,
    killed_before,
    owner_id,
    skip_if_failed,
)
from autotune.tuning.trials import ScriptTrials, TrainTrials, TrialFailed, TrialResult

logger = logging.getLogger(__name__)

OBJECTIVES: dict[str, tuple[str, ...]] = {
    "steps_per_joule": ("steps_per_joule",),
    "steps_per_s": ("steps_per_s",),
    "both": ("steps_per_s", "steps_per_joule"),
    "goodput_per_joule": (GOODPUT_METRIC,),
    "joules_to_target": (TARGET_METRIC,),
}
"""Each ``--objective`` and the study's metric names (maximised), in order."""
SATURATION = 0.05
"""Profiling: a point that gains less than this over the best of its row saturates the row."""
CONFIRM_TOP = 3
"""Confirmation trials re-measure among this many best configs (by median)."""


def given_values(
    trials: TrainTrials | ScriptTrials, exact: bool
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The default config's tuned knob values, split: those among their knob's choices (the
    trial's parameters) and those outside (run as given). With ``exact``, the default config
    is the base config of ``TrainTrials`` as it is (``trainer_device`` auto as it resolves
    here); otherwise, and for ``ScriptTrials``, the trials' ``default`` (all inside)."""
    base = getattr(trials, "base", None)
    if base is None or not exact:
        return trials.default(), {}
    inside, given = {}, {}
    for k in trials.knobs:
        value = knob_value(base, k.name, cuda="cuda" in k.choices)
        (inside if value in k.choices else given)[k.name] = value
    return inside, given


def tuned_values(trial: Any) -> dict[str, Any]:
    """A trial's tuned knob values: its parameters (those it is to get, while it waits) and
    the values it runs as given."""
    return {
        **trial.system_attrs.get("fixed_params", {}),
        **trial.params,
        **(trial.user_attrs.get("given") or {}),
    }


class OfflineStudy:
    """Asks, runs and tells one trial at a time, in the order the module docstring gives.

    Args:
        study: The Optuna study, opened with the metric names of ``objective``.
        trials: ``TrainTrials`` or ``ScriptTrials``.
        objective: A key of ``OBJECTIVES``.
        profile: Whether to run the profiling seeds (where ``trials`` has a plan).
        reference_every: Re-run the default config after this many other trials and scale
            every trial by the latest such reference (``autotune.tuning.reference``); 0: never.
        from_config: The base config of ``trials`` is one the user gave: the default config
            is that as it is (``given_values``).
    """

    def __init__(
        self,
        study: Any,
        trials: TrainTrials | ScriptTrials,
        objective: str = "steps_per_joule",
        profile: bool = True,
        reference_every: int = 0,
        from_config: bool = False,
    ) -> None:
        if objective not in OBJECTIVES:
            raise ValueError(f"objective={objective!r}: allowed {', '.join(OBJECTIVES)}")
        if reference_every < 0:
            raise ValueError(f"reference_every={reference_every}: allowed 0 (never) or more")
        self.reference_every = reference_every
        self.study, self.trials, self.objective = study, trials, objective
        self.metrics = OBJECTIVES[objective]
        self.rows = trials.profile_rows() if profile else []
        inside, given = given_values(trials, exact=from_config)
        self.given = given
        """The default config's values outside their knob's choices, run as given."""
        self._default = {**inside, **given}
        self.changed: dict[str, tuple[Any, Any]] = {}
        """The base config's values of knobs no trial runs as given, as (given, run): set by
        whoever made the study from a config (``autotune.workflows.study.fixed_changes``)."""
        for orphan in fail_orphans(study):  # its process died mid-trial: it runs first again
            self._enqueue(tuned_values(orphan), orphan.user_attrs.get("role"), False)
        self.failed = failed_configs(study)

    @property
    def knobs(self) -> list[Knob]:
        return self.trials.knobs

    def default(self) -> dict[str, Any]:
        """The default config's tuned knob values, as its trials run it (``given_values``)."""
        return dict(self._default)

    def _full(self, values: dict[str, Any]) -> dict[str, Any]:
        """Every knob's value a trial of tuned ``values`` runs with: the fixed ones too."""
        return {**self.trials.fixed, **values}

    def _enqueue(self, values: dict[str, Any], role: str | None, skip_if_exists: bool) -> None:
        """Enqueues a trial of tuned ``values``; those outside their knob's choices go in its
        ``given`` attribute, not its parameters (Optuna refuses them there)."""
        choices = {k.name: k.choices for k in self.knobs}
        given = {n: v for n, v in values.items() if n in choices and v not in choices[n]}
        attrs = {**({"role": role} if role else {}), **({"given": given} if given else {})}
        self.study.enqueue_trial(
            {n: v for n, v in values.items() if n not in given},
            user_attrs=attrs or None,
            skip_if_exists=skip_if_exists,
        )

    def _history(self) -> tuple[dict[str, float | None], set[str], set[str]]:
        """Configs measured (their saturation metric, None if failed), configs waiting or
        running, and the roles already taken."""
        measured: dict[str, float | None] = {}
        pending, roles = set(), set()
        for t in self.study.get_trials(deepcopy=False):
            key = config_key(tuned_values(t))
            roles.add(t.user_attrs.get("role"))
            if t.state == TrialState.COMPLETE:
                measured[key] = score(t, self.metrics[0])
            elif t.state == TrialState.FAIL and "interrupted" not in t.user_attrs:
                measured[key] = None
            elif t.state in (TrialState.RUNNING, TrialState.WAITING):
                pending.add(key)
        return measured, pending, roles

    def next_planned(self) -> tuple[dict[str, Any], str] | None:
        """The default config, then the next profiling seed; None when the sampler's turn."""
        measured, pending, roles = self._history()
        default = self.default()
        key = config_key(default)
        if "default" not in roles and key not in pending and key not in measured and self.knobs:
            return default, "default"
        for row in self.rows:
            best = None
            for values in row:
                key = config_key(values)
                if key in pending:
                    continue
                if key not in measured:
                    return values, "profile"
                value = measured[key]
                if value is None:
                    continue  # not runnable here: skipped, the row goes on
                if best is not None and value < best * (1 + SATURATION):
                    break  # saturated
                best = value if best is None else max(best, value)
        return None

    def _ask_reference(self, taken: Any) -> Any:
        """The reference this step enqueued, where ``ask`` returned an older waiting trial
        (one a killed session enqueued) instead: each such trial is failed as interrupted and
        enqueued again, behind the reference, so it runs once this session can scale it."""
        for _ in range(1000):  # each waiting trial ahead of the reference is taken once
            stale = self.study._storage.get_trial(taken._trial_id)
            role = stale.user_attrs.get("role")  # none: the sampler's role is set when it runs
            fail_interrupted(self.study, taken, "asked before this session's reference run")
            self._enqueue(tuned_values(stale), role, skip_if_exists=False)
            taken = ask(self.study)
            if taken.user_attrs.get("role") in REFERENCE_ROLES:
                break
        return taken

    def _enqueue_next(self, confirm: bool) -> None:
        picked = self.confirm_pick() if confirm else None
        planned = None if picked is not None else self.next_planned()
        if picked is not None:
            self._enqueue(picked, "confirm", skip_if_exists=False)
        elif planned is not None:
            self._enqueue(planned[0], planned[1], skip_if_exists=True)

    def confirm_pick(self) -> dict[str, Any] | None:
        """The config a confirmation trial re-measures (see the module docstring); None while
        no trial has completed. Trials running elsewhere count as measurements."""
        metric = "steps_per_joule" if "steps_per_joule" in self.metrics else self.metrics[0]
        scores: dict[str, list[float]] = {}
        counts: dict[str, int] = {}
        params: dict[str, dict[str, Any]] = {}
        for t in self.study.get_trials(deepcopy=False):
            key = config_key(tuned_values(t))
            value = score(t, metric) if t.state == TrialState.COMPLETE else None
            if value is not None:
                scores.setdefault(key, []).append(float(value))
                params[key] = tuned_values(t)
            if t.state in (TrialState.COMPLETE, TrialState.RUNNING, TrialState.WAITING):
                counts[key] = counts.get(key, 0) + 1
        ranked = sorted(scores, key=lambda k: statistics.median(scores[k]), reverse=True)
        top = ranked[:CONFIRM_TOP]
        if not top:
            return None
        return params[min(top, key=lambda k: (counts[k], top.index(k)))]

    def step(self, confirm: bool = False) -> TrialResult:
        """Runs one trial: a reference run when one is due, else a confirmation (``confirm``,
        once a trial has completed), else the next planned trial or the sampler's."""
        default_ok = config_key(self._full(self.default())) not in self.failed
        trials = self.study.get_trials(deepcopy=False)
        want_reference = default_ok and reference_due(
            trials, self.reference_every, owner_id(), confirm
        )
        if want_reference:
            self._enqueue(self.default(), "reference", skip_if_exists=False)
        else:
            self._enqueue_next(confirm)
        trial = ask(self.study)
        if want_reference and trial.user_attrs.get("role") not in REFERENCE_ROLES:
            trial = self._ask_reference(trial)
        names = {k.name for k in self.knobs}
        given = {n: v for n, v in (trial.user_attrs.get("given") or {}).items() if n in names}
        try:
            values = {
                k.name: given[k.name]
                if k.name in given
                else trial.suggest_categorical(k.name, list(k.choices))
                for k in self.knobs
            }
        except ValueError as exc:
            fail_interrupted(self.study, trial, "knob space differs from the study's")
            raise ValueError(
                f"study {self.study.study_name!r} was made with other choices for "
                f"a knob ({exc}); give the same --knob settings (and --workers) "
                "as when it was made, or a new --study name"
            ) from None
        role = trial.user_attrs.get("role", "sampler")
        if "role" not in trial.user_attrs:
            trial.set_user_attr("role", role)
        row = TrialResult(trial.number, values, role)
        full = self._full(values)
        trial.set_user_attr("values", full)
        if skip_if_failed(self.study, trial, full, self.failed):
            row.error = "skipped: failed before"
            return row
        try:
            measured = self.trials(trial.number, values)
        except TrialFailed as exc:
            row.error = str(exc)
            if exc.killed and not killed_before(self.study, full):
                # killed from outside: not the config's fault until it happens twice
                trial.set_user_attr("killed", row.error)
                fail_interrupted(self.study, trial, f"killed: {row.error}; run once more")
                self._enqueue(values, trial.user_attrs.get("role"), skip_if_exists=False)
                return row
            if exc.too_short:  # --trial-s's doing: the config may run again with a longer one
                fail_interrupted(self.study, trial, row.error)
                return row
        except KeyboardInterrupt:  # Ctrl-C or SIGTERM: its config runs first when resumed
            fail_interrupted(self.study, trial, "Ctrl-C")
            self._enqueue(values, trial.user_attrs.get("role"), skip_if_exists=False)
            raise
        if row.error is not None and role == "reference":
            logger.warning(
                "reference trial %d failed (%s): no more reference runs this session",
                trial.number,
                row.error,
            )
            self.reference_every = 0
            # failed, not marked unrunnable: the default config may run again (a cut run's way)
            fail_interrupted(self.study, trial, f"reference run failed: {row.error}")
            return row
        if row.error is not None:
            fail_config(self.study, trial, full, row.error, self.failed)
            return row
        row.steps_per_s, row.steps_per_joule = measured.steps_per_s, measured.steps_per_joule
        raw = {m: getattr(measured, m) for m in METRICS}
        ref, factors = scale(
            self.study.get_trials(deepcopy=False),
            trial.number,
            owner_id(),
            measured.attrs.get("unit"),
            raw if role in REFERENCE_ROLES else None,
        )
        scaled = {scaled_name(m): None if v is None else v * factors[m] for m, v in raw.items()}
        for m in self.metrics:  # goodput scales as steps/J; figures to a target do not
            if m not in METRICS:
                factor = factors["steps_per_joule"] if m == GOODPUT_METRIC else 1.0
                scaled[scaled_name(m)] = float(measured.attrs.get(m) or 0.0) * factor
        row.attrs = {**measured.attrs, **scaled, "reference_trial": ref}
        row.objective = [scaled[scaled_name(m)] for m in self.metrics]
        for name, value in {**raw, **row.attrs}.items():
            trial.set_user_attr(name, value)
        self.study.tell(trial, row.objective if len(row.objective) > 1 else row.objective[0])
        return row
