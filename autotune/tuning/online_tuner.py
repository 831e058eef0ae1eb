"""The online tuning loop: apply a config, warm up, measure a window, tell Optuna, repeat.

``OnlineTuner.tick`` is called often (every runner tick) and never blocks; it moves through

    apply -> warm-up (until the job says the change took effect, then ``warmup_s`` if the
          change started processes) -> measure (counters read about once a second until the
          estimate is precise, or for goodput until the batch's efficiency has moved with
          the noise scale, ``autotune.tuning.windows``) -> tell -> apply ...

and, once ``trials`` trials are done, holds the best config and re-measures it every
``recheck_s``; if the best has drifted down by more than ``drift_tol`` from its median, it
explores again for ``repeat_every`` more trials. Near the job's end (``Counters.remaining_s``),
when another trial could not pay back, it holds the best config too (``tuner_rules.endgame``).

* Objective: ``steps_per_joule`` (default), ``steps_per_s``, or ``weighted`` (a weighted mean
  of both, each relative to the first trial's value).
* Constraints: a throughput floor and a policy-lag ceiling; a trial that breaks one is told to
  Optuna with its constraint values (``Trial.set_constraint``) and never becomes the best.
* Noise: every ``repeat_every`` trials the incumbent is measured again, and a new best (not
  the start config: exploring first pays more) is measured again at once until two measurements
  agree within ``tuner_rules.AGREE`` (or three exist); configs compare by their medians.
* Budget: under the daemon, configs stay inside the job's budget (``autotune.tuning.budget``).
* Failures: a config the job refuses (or that fails) is marked failed and never applied again.
* Resume: a tuner opened on a study that already holds trials rebuilds its history from them
  (medians, failed configs, trial count); trials left RUNNING by a tuner that died are failed;
  a start config whose trial was cut is measured first again (``tuner_rules.start_due``).
* Samplers: ``model`` (default where the job was sized from probes:
  ``autotune.tuning.model_sampler``), ``tpe``, or ``grid`` (every combination of the knobs'
  choices once, in random order, without the default first, incumbent repeats or saturation
  pruning; the baseline a tuner is compared with).
* GMI-DRL's saturation heuristic: once doubling ``envs_per_actor`` gained less than
  ``saturation_gain`` in steps/s, larger values are pruned without being applied (more envs cost
  memory and policy lag for nothing).
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Callable
from typing import Any

import optuna

from autotune.tuning.budget import BudgetLimits
from autotune.tuning.counters import Counters, Measurement, measure
from autotune.tuning.holding import Holding
from autotune.tuning.job import Current, History, Job, restore_history
from autotune.tuning.knobs import Knob
from autotune.tuning.model_inputs import update_samples
from autotune.tuning.reference import GOODPUT_METRIC
from autotune.tuning.settings import TunerSettings, constraint_values, objective_value
from autotune.tuning.storage import (
    ask,
    config_key,
    fail_config,
    fail_interrupted,
    fail_orphans,
    prune,
    skip_if_failed,
)
from autotune.tuning.tuner_rules import (
    change_kind,
    change_warmup,
    check_objective,
    confirmed,
    endgame,
    fail_quietly,
    in_space,
    start_due,
    suggest,
)
from autotune.tuning.windows import SAMPLE_S, WindowRule, ends_early, half_width, window_done
from runtime.config import ConfigError

logger = logging.getLogger(__name__)

MEASURED = tuple(Measurement.__dataclass_fields__)


class OnlineTuner(BudgetLimits, Holding):
    """Ask/tell tuning of a running job (see the module docstring).

    Args:
        study: The Optuna study (maximize); its storage keeps every trial.
        space: The knobs (``autotune.tuning.knobs``); only ``Knob.online`` ones are suggested.
        job: The running job.
        settings: Measurement and decision settings.
        base: The job's current values of the online knobs (the default config).
        clock: Seconds, monotonic (injectable for tests).
        defaults: The job's values of the other knobs (``batch_size`` sets how long a window
            must be when it is not tuned).
    """

    def __init__(
        self,
        study: optuna.Study,
        space: dict[str, Knob],
        job: Job,
        settings: TunerSettings,
        base: dict[str, Any],
        clock: Callable[[], float] = time.monotonic,
        defaults: dict[str, Any] | None = None,
    ) -> None:
        problems = settings.problems()
        if problems:
            raise ValueError("invalid tuner settings: " + "; ".join(problems))
        self.study, self.job, self.settings, self.clock = study, job, settings, clock
        self.knobs = [k for k in space.values() if k.online]
        self.base = {k.name: base[k.name] for k in self.knobs}
        self.history = History(rerate=settings.objective == GOODPUT_METRIC)
        self.reference: Measurement | None = None
        self.trials_done = 0
        self.explore_until = settings.trials
        self.holding = False
        self.unmet: str | None = None
        """Why tuning stopped without a best config (constraints nobody met), else None."""
        self.log: list[dict[str, Any]] = []
        """One entry per measured window: seconds since the tuner started (``t``), unix time
        (``at``), values, the measurement, the objective and whether it was a trial or a
        re-check of the best."""
        self.t0 = clock()
        self.current: Current | None = None
        self.applied: dict[str, Any] | None = None
        """The values last applied (what a change is a change from)."""
        self.defaults = dict(defaults or {})
        """The job's values of knobs not tuned (the batch size, when it is fixed)."""
        self.rule = WindowRule(settings.window_s, settings.window_max_s, settings.window_target)
        self._envs_cap: int | None = None
        self.follow_noise = settings.objective == GOODPUT_METRIC and "batch_size" in self.base
        """Goodput windows end once their batch's efficiency moved (``windows.ends_early``)."""
        self.grid = settings.sampler == "grid"
        if self.grid:
            self.explore_until = math.prod(len(k.choices) for k in self.knobs)
        fail_orphans(study)
        check_objective(study, settings.objective)  # its values are compared as one figure
        self._restore()
        first = self.knobs and not self.grid and in_space(self.knobs, self.base)
        if first and start_due(study.get_trials(deepcopy=False), self.base, self.history.failed):
            study.enqueue_trial(self.base)  # the default config first (again, if it was cut)

    def _restore(self) -> None:
        """Rebuilds the history from the study's finished trials (a resumed study)."""
        names = {k.name for k in self.knobs}  # trials of another space (a knob fixed since)
        of_space = lambda p: set(p) == names and in_space(self.knobs, p)  # noqa: E731
        self.history, self.trials_done, ref = restore_history(self.study, self._batch, of_space)
        self.history.rerate = self.settings.objective == GOODPUT_METRIC
        if ref is not None:
            self.reference = Measurement(
                **{f: ref.get(f, 0.0) for f in MEASURED if f != "node_rates"}
            )
        if self.trials_done:
            self.restored = self.trials_done
            logger.info(
                "resumed study %r: %d trials, %d configs measured",
                self.study.study_name,
                self.trials_done,
                len(self.history.by_config),
            )
            if not self.grid:
                self.explore_until = max(self.explore_until, self.trials_done)
            for key in list(self.history.speed):
                self._update_saturation(json.loads(key))

    def close(self, reason: str) -> None:
        """Ends the trial being measured as failed with ``reason`` (the job ended or left);
        its config is not marked bad."""
        cur, self.current = self.current, None
        if cur is not None and cur.trial is not None:
            fail_interrupted(self.study, cur.trial, reason)
            self.trials_done += 1

    # --- the loop -------------------------------------------------------------------------

    def tick(self) -> None:
        """Advances the loop; call it often. Never blocks."""
        now = self.clock()
        cur = self.current
        if cur is None:
            self._next(now)
            return
        s = self.settings
        if cur.phase == "warmup":
            if cur.ready_at is None:
                try:
                    ready = self.job.ready()
                    if not ready and now - cur.since > s.settle_timeout_s:
                        why = "actors not stepping or GMIs not resumed"
                        raise ConfigError(
                            [f"did not take effect within {s.settle_timeout_s:.0f} s ({why})"]
                        )
                except ConfigError as exc:  # what the job runs now is not known: the next
                    self.current, self.applied = None, None  # change warms up in full
                    self._failed(cur.trial, cur.values, exc)
                    return
                if ready:
                    cur.ready_at = now
                return
            if now - cur.ready_at >= cur.warmup_s:
                cur.samples = [self.job.counters()]
                cur.phase, cur.since = "measure", now
        elif cur.phase == "measure" and now - cur.since >= SAMPLE_S * len(cur.samples):
            cur.samples.append(self.job.counters())
            per_joule, batch = s.objective != "steps_per_s", self._batch(cur.values)
            done = window_done(self.rule, cur.samples, batch, per_joule)
            moved = not done and self.follow_noise and ends_early(self.rule, cur.samples, batch)
            if not (done or moved):
                return
            if moved:
                logger.info("window ends early: batch %s's efficiency moved (noise scale)", batch)
            m = measure(cur.samples[0], cur.samples[-1])
            unmetered = per_joule and m.steps_per_s > 0 and m.steps_per_joule is None
            if unmetered and m.window_s < s.empty_windows * self.rule.ceiling_s:
                return  # steps but no joules metered yet: no rate per joule; the window goes on
            if m.steps_per_s <= 0:
                cur.empty += 1
                if cur.empty < s.empty_windows:
                    logger.info("no step trained in a %.0f s window; measuring again", m.window_s)
                    cur.samples, cur.since = [self.job.counters()], now
                    return
            if m.steps_per_s <= 0 or unmetered:
                self.current = None
                why = f"no env step trained in {cur.empty} windows of {m.window_s:.0f} s: "
                why += "the config stalls training"
                if unmetered:  # the meter's gap, maybe: marked bad only the second time
                    why = f"no energy metered over {m.window_s:.0f} s of training"
                self._failed(cur.trial, cur.values, ConfigError([why]), unmetered)
            else:
                self._finish(m, now, cur.samples)
            self._next(now)  # no tick without a config on its way

    def _batch(self, values: dict[str, Any]) -> int | None:
        """The samples a learner update of ``values`` trains: the lumps a window's trained
        steps arrive in (``update_samples``)."""
        return update_samples({**self.defaults, **values})

    def _warmup(self, values: dict[str, Any]) -> float:
        return change_warmup(self.knobs, self.applied or {}, values, self.settings.warmup_s)

    def _next(self, now: float) -> None:
        if not self.knobs:
            return
        if self.trials_done >= self.explore_until or self._endgame():
            self._hold(now)
            return
        best = self.history.best()
        repeat = self.trials_done and self.trials_done % self.settings.repeat_every == 0
        # a new best is measured again at once; the start config waits for the periodic repeat
        unsure = best is not None and not confirmed(self.history.values(best[0]))
        repeat = repeat or (unsure and best[0] != config_key(self.base))
        if repeat and best and not self.grid and in_space(self.knobs, json.loads(best[0])):
            self.study.enqueue_trial(json.loads(best[0]))  # re-measure the incumbent
        trial = ask(self.study)
        try:
            self._try(trial, now)
        except BaseException:  # the trial is told, not left RUNNING, whatever stopped it
            if self.current is None or self.current.trial is not trial:
                fail_quietly(self.study, trial)
            raise

    def _try(self, trial: optuna.trial.Trial, now: float) -> None:
        """Starts ``trial``'s config, unless it failed before or lies outside the budget or
        past the envs' saturation."""
        values = suggest(self.knobs, trial)
        if skip_if_failed(self.study, trial, values, self.history.failed):
            self.trials_done += 1
            return
        if self._out_of_budget(trial, values):
            return
        envs, best = values.get("envs_per_actor"), self.history.best()
        capped = self._envs_cap is not None and not self.grid
        incumbent = best is not None and best[0] == config_key(values)  # measured again
        if capped and envs is not None and envs > self._envs_cap and not incumbent:
            why = f"envs_per_actor={envs} is past saturation ({self._envs_cap})"
            prune(self.study, trial, why)
            logger.info("trial %d pruned: %s", trial.number, why)
            self.trials_done += 1
            return
        self._start(trial, values, now)

    def _endgame(self) -> bool:
        """Whether a best exists and too little of the job is left for another trial."""
        if self.grid or self.history.best() is None:
            return False
        try:  # a remote job that has not reported yet cannot say
            left = self.job.counters().remaining_s
        except ConfigError:
            return False
        return endgame(left, [w["trial_s"] for w in self.log if w["state"] == "trial"])

    def _start(self, trial: optuna.trial.Trial | None, values: dict[str, Any], now: float) -> None:
        warmup = self._warmup(values)
        before = self._last_return()
        try:
            self.job.apply(values)
        except ConfigError as exc:
            self._failed(trial, values, exc)
            return
        kind = change_kind({k.name: k.apply for k in self.knobs}, self.applied or {}, values)
        self.applied = dict(values)
        self.current = Current(trial, values, "warmup", now, warmup_s=warmup, started=now)
        self.current.return_before, self.current.change = before, kind

    def _last_return(self) -> float | None:
        try:
            return self.job.counters().return_mean
        except ConfigError:  # a remote job that has not reported yet
            return None

    def _failed(
        self, trial: optuna.trial.Trial | None, values: dict, exc: Exception, unmetered=False
    ) -> None:
        fail_config(self.study, trial, values, str(exc), self.history.failed, unmetered=unmetered)
        if trial is not None:
            self.trials_done += 1
        logger.warning("config %s refused: %s", values, exc)

    # --- telling ----------------------------------------------------------------------------

    def _finish(self, m: Measurement, now: float, samples: list[Counters]) -> None:
        cur = self.current
        assert cur is not None
        self.current = None
        if self.reference is None:
            self.reference = m
        value = objective_value(self.settings, m, self.reference)
        per_joule = self.settings.objective != "steps_per_s"
        constraints = constraint_values(self.settings, m)
        feasible = all(c <= 0 for c in constraints.values())
        key = config_key(cur.values)
        best_before = self.history.best()
        if m.noise_scale:
            self.history.noise_scale = m.noise_scale
        self.history.add(key, value, m.steps_per_joule, self._batch(cur.values), feasible)
        self.history.speed.setdefault(key, []).append(m.steps_per_s)
        self._update_saturation(cur.values)
        state = "hold" if cur.trial is None else "trial"
        returns = {"return_before": cur.return_before, "return_after": samples[-1].return_mean}
        if cur.trial is not None:
            for name, c in constraints.items():
                cur.trial.set_constraint(name, c)
            for name, v in {**{k: getattr(m, k) for k in MEASURED}, **returns}.items():
                cur.trial.set_user_attr(name, v)
            cur.trial.set_user_attr("feasible", feasible)
            if cur.change is not None:  # what it cost, for the model sampler's next plans
                cur.trial.set_user_attr(
                    "change", {"kind": cur.change, "s": cur.since - cur.started}
                )
            self.study.tell(cur.trial, value)
            self.trials_done += 1
        else:  # a recheck of the held best
            self._recheck(key, feasible, best_before)
        self.log.append(
            {
                "t": now - self.t0,
                "at": time.time(),
                "values": cur.values,
                "objective": value,
                "feasible": feasible,
                "state": state,
                "incumbent": best_before[1] if best_before else None,
                **m.__dict__,
                "precision": half_width(samples, self._batch(cur.values), per_joule),
                **returns,
                "trial_s": now - cur.started,
            }
        )

    def _update_saturation(self, values: dict[str, Any]) -> None:
        """Caps envs_per_actor once doubling it stopped paying (other knobs as in ``values``)."""
        found = self.history.envs_cap(values, self.settings.saturation_gain)
        if found is not None and (self._envs_cap is None or found[0] < self._envs_cap):
            self._envs_cap = found[0]
            logger.info("envs_per_actor saturates at %d (gain %.1f %%)", found[0], 100 * found[1])

    def best(self) -> dict[str, Any] | None:
        """The best config so far (median objective among feasible measurements)."""
        best = self.history.best()
        if best is None:
            return None
        n = len(self.history.by_config[best[0]])
        return {"values": json.loads(best[0]), "objective": best[1], "measurements": n}
