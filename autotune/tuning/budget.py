"""A job's tuner inside the budget the daemon gave it (``autotune.control.allocator``).

The budget's cores bound the actors (an actor per core at most; the stages share them, as
with ``auto`` sizing) and a CPU trainer's threads; its MPS share bounds the GMIs'
``mps_pct``, and a budget with no share of a GPU leaves the trainer on the CPU. The knobs keep
their choices (an Optuna study's space cannot change), so a suggested config outside the budget
is pruned, not measured, and the nearest config inside it is enqueued in its place.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import Any

from autotune.tuning.knobs import MPS_CHOICES, Knob
from autotune.tuning.perf_model import charged_share
from autotune.tuning.storage import prune
from autotune.tuning.tuner_rules import in_space, unmet_message
from runtime.config import ConfigError

logger = logging.getLogger(__name__)


def limits_for(cores: int, mps_pct: int | None) -> dict[str, int]:
    """The knob limits of a budget of ``cores`` cores and ``mps_pct`` % of a GPU (None: no
    GPU in the budget's terms, nothing bounded there; 0: no share, a CPU trainer)."""
    out = {"actors": max(1, cores), "trainer_threads": max(1, cores)}
    if mps_pct is not None:
        out["mps_pct"] = int(mps_pct)
    return out


def mps_within(share: int, choices: tuple[int, ...] = MPS_CHOICES) -> tuple[int, ...]:
    """The MPS shares of ``choices`` a GMI may run at within ``share`` % of its GPU (none: the
    trainer stays on the CPU). The one rule that `auto` sizing, the tuner and the daemon's
    rates all keep."""
    return tuple(c for c in choices if c <= share) if share > 0 else ()


def _share_ok(values: dict[str, Any], share: int) -> bool:
    if values.get("trainer_device", "cuda") == "cpu":
        return True
    pct = values.get("mps_pct")
    return share > 0 and (pct is None or pct <= share)


def _cpu_threads(values: dict[str, Any]) -> int:
    """The cores a CPU trainer's threads take beside the actors (0 on a GPU)."""
    if values.get("trainer_device", "cuda") != "cpu":
        return 0
    return int(values.get("trainers", 1)) * int(values.get("trainer_threads", 1))


def _cores_left(values: dict[str, Any], limits: dict[str, int]) -> int | None:
    """The actors that fit beside a CPU trainer's threads in the budget's cores (its
    ``actors`` limit), as ``auto`` sizing counts them (``sizing.fits_cores``); None: no bound."""
    if "actors" not in limits:
        return None
    return max(limits["actors"], 2) - _cpu_threads(values)


def fits(values: dict[str, Any], limits: dict[str, int] | None) -> bool:
    """Whether ``values`` stay inside ``limits`` (no limits: always): each bounded knob, and
    the actors with a CPU trainer's threads within the cores."""
    if not limits:
        return True
    for name in ("actors", "trainer_threads"):
        if name in values and name in limits and values[name] > limits[name]:
            return False
    left = _cores_left(values, limits)
    if left is not None and _cpu_threads(values) and values.get("actors", 1) > left:
        return False
    return "mps_pct" not in limits or _share_ok(values, limits["mps_pct"])


def clamp(values: dict[str, Any], limits: dict[str, int] | None, knobs: list[Knob]) -> dict:
    """The config nearest ``values`` inside ``limits``: each bounded knob at its largest choice
    within its limit; a GPU trainer whose share no choice fits moves to the CPU."""
    if fits(values, limits):
        return dict(values)
    out = dict(values)
    choices = {k.name: k.choices for k in knobs}
    for name in ("actors", "trainer_threads"):
        if name in out and name in limits and out[name] > limits[name]:
            inside = [c for c in choices.get(name, ()) if c <= limits[name]]
            out[name] = max(inside) if inside else limits[name]
    share = limits.get("mps_pct")
    if share is not None and not _share_ok(out, share):
        inside = mps_within(share, choices.get("mps_pct", ()))
        if inside:
            out["mps_pct"] = max(inside)
        elif "cpu" in choices.get("trainer_device", ()):
            out["trainer_device"] = "cpu"
            out.pop("mps_pct", None)
    left = _cores_left(out, limits)
    if left is not None and _cpu_threads(out) and out.get("actors", 1) > left:
        if left < 1:  # the trainer's threads alone fill the cores: one left for an actor
            per = max(1, (max(limits["actors"], 2) - 1) // int(out.get("trainers", 1)))
            inside = [c for c in choices.get("trainer_threads", ()) if c <= per]
            out["trainer_threads"] = max(inside) if inside else per
            left = _cores_left(out, limits)
        inside = [c for c in choices.get("actors", ()) if c <= max(left, 1)]
        out["actors"] = max(inside) if inside else max(left, 1)
    return out


class BudgetLimits:
    """The ``OnlineTuner``'s side of a budget (mixed in; see the module docstring)."""

    limits: dict[str, int] | None = None

    def set_limits(self, limits: dict[str, int] | None) -> None:
        """Takes a new budget's limits. A config being measured or held outside them is
        replaced at once by the nearest one inside (its trial ends pruned: not the config's
        fault); the model sampler plans inside them from now on. A tuner that holds its best
        explores again when the budget grows (more cores or a larger GPU share to use)."""
        grew = _grew(self.limits, limits)
        self.limits = dict(limits) if limits else None
        if grew and self.holding:  # room to use: explore again before holding
            self.holding = False
            self.explore_until = max(
                self.explore_until, self.trials_done + self.settings.repeat_every
            )
        sampler = getattr(self.study, "sampler", None)
        if hasattr(sampler, "set_limits"):
            sampler.set_limits(self.limits)
        running = self.current.values if self.current is not None else self.applied
        if running is None or fits(running, self.limits):
            return
        self._end_current("the job's budget shrank under it")
        inside = clamp(running, self.limits, self.knobs)
        logger.info("budget limits %s: %s -> %s", self.limits, running, inside)
        self._start(None, inside, self.clock())

    def adopt(self, values: dict[str, Any]) -> None:
        """Takes a config sized for a new budget (the model's best inside it): applied at once
        and measured as the first config of that budget. What was measured before compares no
        longer (the job is now charged another share of the machine), so the tuner's memory of
        it is set aside, failures kept, and it explores again where the job has time to."""
        names = {k.name: k.choices for k in self.knobs}
        base = dict(self.applied or self.base)
        base.update({k: v for k, v in values.items() if k in names and v in names[k]})
        if base.get("trainer_device") == "cpu":
            base.pop("mps_pct", None)
        inside = clamp(base, self.limits, self.knobs)
        self._end_current("the job's budget changed under it")
        self.history = type(self.history)(failed=self.history.failed)
        self.holding = False
        self.explore_until = max(self.explore_until, self.trials_done + self.settings.repeat_every)
        logger.info("a new budget: %s, sized for it", inside)
        self._start(None, inside, self.clock())

    def _give_up(self) -> None:
        """No config met the constraints: the job goes back to its default config, inside
        its budget where it has one."""
        self.unmet = unmet_message(self.settings, self.history.speed, self.trials_done)
        logger.error("%s", self.unmet)
        base = self._inside(self.base)
        try:
            self.job.apply(base)  # applied, not measured: nothing left to compare it with
            self.applied = dict(base)
        except ConfigError as exc:
            logger.error("the default config was refused too: %s", exc)

    def _out_of_budget(self, trial: Any, values: dict[str, Any]) -> bool:
        """Prunes ``trial`` and enqueues the nearest config inside the budget, if ``values``
        are outside it (True), else False."""
        full = {**self.defaults, **(self.applied or self.base), **values}  # and fixed ones
        if fits(full, self.limits):
            return False
        inside = {k: v for k, v in clamp(full, self.limits, self.knobs).items() if k in values}
        prune(self.study, trial, f"outside the job's budget {self.limits}")
        if fits({**full, **inside}, self.limits) and in_space(self.knobs, inside):
            self.study.enqueue_trial(inside)  # measured as a trial of its own, next
        else:  # no config of the space fits: counted, so the tuner ends up holding
            self.trials_done += 1
        logger.info("trial %d outside the budget %s: %s instead", trial.number, self.limits, inside)
        return True

    def _end_current(self, reason: str) -> None:
        """Ends the config being measured; its trial, if it has one, pruned for ``reason``."""
        cur, self.current = self.current, None
        if cur is not None and cur.trial is not None:
            prune(self.study, cur.trial, reason)
            self.trials_done += 1

    def _inside(self, values: dict[str, Any]) -> dict[str, Any]:
        """``values`` clamped into the budget (a held best from before it shrank)."""
        return clamp(values, self.limits, self.knobs)


def _grew(old: dict[str, Any] | None, new: dict[str, Any] | None) -> bool:
    """Whether ``new`` limits allow more than ``old`` (None: no limit)."""
    if new is None:
        return old is not None
    if old is None:
        return False
    inf = float("inf")  # a limit that is not there allows everything
    return any(new.get(k, inf) > old.get(k, inf) for k in ("actors", "mps_pct"))


def machine_within(machine: Any, limits: dict[str, Any] | None) -> Any:
    """The model sampler's machine cut to the budget's cores, charged the budget's shares of
    the machine's idle draw (``gpu_share``, ``cpu_share``: how the job is metered now)."""
    if not limits or "trainer_threads" not in limits:
        return machine
    cut = replace(machine, cores=limits["trainer_threads"])
    if "gpu_share" in limits or "cpu_share" in limits:
        cut = charged_share(cut, limits.get("gpu_share", 1.0), limits.get("cpu_share", 1.0))
    return cut
