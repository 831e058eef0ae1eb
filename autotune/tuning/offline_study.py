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

1. the default config (``role`` "default"), the yardstick ``autotune export`` compares with;
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
Pareto front ``pareto_front`` gives). The study is in RDB storage and resumes where it stopped,
profiling included; a trial cut by Ctrl-C is failed as interrupted and its config may run
again.
"""

from __future__ import annotations

import dataclasses
import logging
import statistics
from collections.abc import Callable
from typing import Any

from autotune.tuning.knobs import Knob
from autotune.tuning.reference import (
    METRICS,
    REFERENCE_ROLES,
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
    owner_id,
    skip_if_failed,
)
from autotune.workflows.tune import config_changes, knob_values
from runtime.config import ConfigError, TrainConfig

logger = logging.getLogger(__name__)

OBJECTIVES: dict[str, tuple[str, ...]] = {
    "steps_per_joule": ("steps_per_joule",),
    "steps_per_s": ("steps_per_s",),
    "both": ("steps_per_s", "steps_per_joule"),
}
"""Each ``--objective`` and the study's metric names (maximised), in order."""
SATURATION = 0.05
"""Profiling: a point that gains less than this over the best of its row saturates the row."""
CONFIRM_TOP = 3
"""Confirmation trials re-measure among this many best configs (by median)."""


class TrialFailed(Exception):
    """A trial that could not be measured; the message says why."""


@dataclasses.dataclass
class Measured:
    """One trial's figures; ``attrs`` are kept as the trial's user attributes."""

    steps_per_s: float
    steps_per_joule: float
    attrs: dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class TrialResult:
    number: int
    values: dict[str, Any]
    role: str = "sampler"
    objective: list[float] | None = None
    steps_per_s: float | None = None
    steps_per_joule: float | None = None
    attrs: dict[str, Any] = dataclasses.field(default_factory=dict)
    error: str | None = None


def run_config(
    cfg: TrainConfig, warmup_s: float, meter: Any = None
) -> tuple[dict[str, Any], dict[str, Any]]:
    """One quiet training run of ``cfg``; returns its result and its rates from ``warmup_s``
    after its first trained step to its end (process start-up is left out, however long).
    ``meter`` is the ``EnergyMeter`` to charge (default: the machine's).

    Raises:
        ConfigError: the config cannot run here.
        runtime.runner.RunError: the run failed, or trained too little to be measured.
    """
    from runtime.results import timeline_rate
    from runtime.runner import RunError, Runner

    info = cfg.validate()
    runner = Runner(cfg, info)
    runner.meter = meter
    result = runner.run()
    rows = result["timeline"]["rows"]
    first = next((r[0] for r in rows if r[1] > 0), None)
    rate = None if first is None else timeline_rate(result, first + warmup_s, result["wall_s"])
    if rate is None or not rate["steps_per_s"] > 0:
        raise RunError(
            f"trained too little to measure: {result['env_steps']} steps, the first "
            f"after {first if first is None else round(first, 1)} s of "
            f"{result['wall_s']:.0f} s; give a --trial-s of at least warm-up "
            f"({warmup_s:g} s) + 10 s after training starts"
        )
    return result, rate


def _tuned(space: dict[str, Knob] | list[Knob]) -> tuple[list[Knob], dict[str, Any]]:
    knobs = list(space.values()) if isinstance(space, dict) else list(space)
    usable = [k for k in knobs if k.unavailable is None]
    return (
        [k for k in usable if len(k.choices) > 1],
        {k.name: k.choices[0] for k in usable if len(k.choices) == 1},
    )


def _nearest(knob: Knob, value: Any) -> Any:
    if value in knob.choices:
        return value
    if isinstance(value, int) and all(isinstance(c, int) for c in knob.choices):
        return min(knob.choices, key=lambda c: (abs(c - value), c))
    return knob.choices[0]


class TrainTrials:
    """Trials as ``autotune train`` runs of ``base`` changed by the knob values.

    Args:
        space: The knobs; every one with several choices that applies here is tuned.
        base: The config each trial starts from (its ``max_wall_s`` is the trial length).
        warmup_s: Seconds after the first trained step left out of each run's figures.
        run: How a config is run (injectable for tests).
        meter: A factory of the ``EnergyMeter`` each run charges (None: the machine's).
    """

    kind = "train"

    def __init__(
        self,
        space: dict[str, Knob],
        base: TrainConfig,
        warmup_s: float,
        run: Callable[..., tuple[dict, dict]] = run_config,
        meter: Callable[[], Any] | None = None,
    ) -> None:
        self.base, self.warmup_s, self._run, self._meter = base, warmup_s, run, meter
        self.knobs, self.fixed = _tuned(space)

    def default(self) -> dict[str, Any]:
        """The base config's knob values (the nearest choice where it is outside the space)."""
        now = knob_values(self.base, {k.name: k for k in self.knobs})
        return {k.name: _nearest(k, now[k.name]) for k in self.knobs}

    def profile_rows(self) -> list[list[dict[str, Any]]]:
        """GMI-DRL's profiling plan: one row per trainer GMI count, environments per actor
        ascending, every actor slot filled (the most actors allowed); [] if envs are fixed."""
        by_name = {k.name: k for k in self.knobs}
        if "envs_per_actor" not in by_name:
            return []
        start = self.default()
        if "actors" in by_name:
            start["actors"] = max(by_name["actors"].choices)
        gmis = sorted(by_name["trainers"].choices) if "trainers" in by_name else [None]
        envs = sorted(by_name["envs_per_actor"].choices)
        return [
            [{**start, **({} if g is None else {"trainers": g}), "envs_per_actor": e} for e in envs]
            for g in gmis
        ]

    def __call__(self, number: int, values: dict[str, Any]) -> Measured:
        from runtime.runner import RunError

        try:
            cfg = dataclasses.replace(self.base, **config_changes({**self.fixed, **values}))
            meter = None if self._meter is None else self._meter()
            result, rate = self._run(cfg, self.warmup_s, meter)
        except ConfigError as exc:
            raise TrialFailed(f"not runnable: {exc}") from None
        except RunError as exc:
            raise TrialFailed(f"run failed: {exc}") from None
        attrs = {
            "gpu_w": rate["gpu_w"],
            "cpu_w": rate["cpu_w"],
            "lost_steps": result["lost_steps"],
            "cpu_source": result["energy"]["cpu_source"],
        }
        return Measured(rate["steps_per_s"], rate["steps_per_joule"] or 0.0, attrs)


class ScriptTrials:
    """Trials as runs of a wrapped script (``autotune.wrap.wrapper.Wrapper``); scored per step it
    reports, or per run if it reports none."""

    kind = "script"

    def __init__(self, wrapper: Any, space: list[Knob]) -> None:
        self.wrapper = wrapper
        self.knobs, self.fixed = _tuned(space)

    def default(self) -> dict[str, Any]:
        return {k.name: k.choices[0] for k in self.knobs}

    def profile_rows(self) -> list[list[dict[str, Any]]]:
        return []  # a script's knobs have no GMI or env meaning to profile by

    def __call__(self, number: int, values: dict[str, Any]) -> Measured:
        run = self.wrapper.run_trial(number, {**self.fixed, **values})
        if run.error is not None:
            raise TrialFailed(run.error)
        attrs = {
            "wall_s": run.wall_s,
            "steps": run.steps,
            "unit": run.unit,
            "gpu_j": run.gpu_j,
            "cpu_j": run.cpu_j,
            "cpu_source": "model",
            "stopped": run.stopped,
            "gpus": run.gpus,
            "metrics": run.metrics,
        }
        return Measured(run.score("steps_per_s"), run.score("steps_per_joule"), attrs)


class OfflineStudy:
    """Asks, runs and tells one trial at a time, in the order the module docstring gives.

    Args:
        study: The Optuna study, opened with the metric names of ``objective``.
        trials: ``TrainTrials`` or ``ScriptTrials``.
        objective: A key of ``OBJECTIVES``.
        profile: Whether to run the profiling seeds (where ``trials`` has a plan).
        reference_every: Re-run the default config after this many other trials and scale
            every trial by the latest such reference (``autotune.tuning.reference``); 0: never.
    """

    def __init__(
        self,
        study: Any,
        trials: TrainTrials | ScriptTrials,
        objective: str = "steps_per_joule",
        profile: bool = True,
        reference_every: int = 0,
    ) -> None:
        if objective not in OBJECTIVES:
            raise ValueError(f"objective={objective!r}: allowed {', '.join(OBJECTIVES)}")
        if reference_every < 0:
            raise ValueError(f"reference_every={reference_every}: allowed 0 (never) or more")
        self.reference_every = reference_every
        self.study, self.trials, self.objective = study, trials, objective
        self.metrics = OBJECTIVES[objective]
        self.rows = trials.profile_rows() if profile else []
        fail_orphans(study)
        self.failed = failed_configs(study)

    @property
    def knobs(self) -> list[Knob]:
        return self.trials.knobs

    def _history(self) -> tuple[dict[str, float | None], set[str], set[str]]:
        """Configs measured (their saturation metric, None if failed), configs waiting or
        running, and the roles already taken."""
        from optuna.trial import TrialState

        measured: dict[str, float | None] = {}
        pending, roles = set(), set()
        for t in self.study.get_trials(deepcopy=False):
            key = config_key(t.params)
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
        default = self.trials.default()
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
            self.study.enqueue_trial(
                stale.system_attrs.get("fixed_params", {}),
                user_attrs={"role": role} if role else None,
                skip_if_exists=False,
            )
            taken = ask(self.study)
            if taken.user_attrs.get("role") in REFERENCE_ROLES:
                break
        return taken

    def _enqueue_next(self, confirm: bool) -> None:
        picked = self.confirm_pick() if confirm else None
        planned = None if picked is not None else self.next_planned()
        if picked is not None:
            self.study.enqueue_trial(picked, user_attrs={"role": "confirm"}, skip_if_exists=False)
        elif planned is not None:
            self.study.enqueue_trial(
                planned[0], user_attrs={"role": planned[1]}, skip_if_exists=True
            )

    def confirm_pick(self) -> dict[str, Any] | None:
        """The config a confirmation trial re-measures (see the module docstring); None while
        no trial has completed. Trials running elsewhere count as measurements."""
        from optuna.trial import TrialState

        metric = "steps_per_joule" if "steps_per_joule" in self.metrics else self.metrics[0]
        scores: dict[str, list[float]] = {}
        counts: dict[str, int] = {}
        params: dict[str, dict[str, Any]] = {}
        for t in self.study.get_trials(deepcopy=False):
            key = config_key(t.params)
            value = score(t, metric) if t.state == TrialState.COMPLETE else None
            if value is not None:
                scores.setdefault(key, []).append(float(value))
                params[key] = dict(t.params)
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
        default_ok = config_key(self.trials.default()) not in self.failed
        trials = self.study.get_trials(deepcopy=False)
        want_reference = default_ok and reference_due(
            trials, self.reference_every, owner_id(), confirm
        )
        if want_reference:
            self.study.enqueue_trial(
                self.trials.default(), user_attrs={"role": "reference"}, skip_if_exists=False
            )
        else:
            self._enqueue_next(confirm)
        trial = ask(self.study)
        if want_reference and trial.user_attrs.get("role") not in REFERENCE_ROLES:
            trial = self._ask_reference(trial)
        try:
            values = {
                k.name: trial.suggest_categorical(k.name, list(k.choices)) for k in self.knobs
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
        if skip_if_failed(self.study, trial, values, self.failed):
            row.error = "skipped: failed before"
            return row
        try:
            measured = self.trials(trial.number, values)
        except TrialFailed as exc:
            row.error = str(exc)
        except KeyboardInterrupt:
            fail_interrupted(self.study, trial, "Ctrl-C")
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
            fail_config(self.study, trial, values, row.error, self.failed)
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
        row.attrs = {**measured.attrs, **scaled, "reference_trial": ref}
        row.objective = [scaled[scaled_name(m)] for m in self.metrics]
        for name, value in {**raw, **row.attrs}.items():
            trial.set_user_attr(name, value)
        self.study.tell(trial, row.objective if len(row.objective) > 1 else row.objective[0])
        return row
