"""What the online tuner maximises and under which constraints, and how it measures and decides
(``TunerSettings``); the loop itself is ``autotune.tuning.online_tuner``.

* Objective: ``steps_per_joule`` (default), ``steps_per_s``, or ``weighted`` (a weighted mean
  of both, each relative to a reference window, the first trial's).
* Constraints: a throughput floor and a policy-lag ceiling, as Optuna constraint values
  (<= 0 is feasible).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from autotune.tuning.counters import Measurement

OBJECTIVES = ("steps_per_joule", "steps_per_s", "weighted", "goodput_per_joule")
SAMPLERS = ("model", "tpe", "grid")


@dataclass(frozen=True)
class TunerSettings:
    """How the online tuner measures and decides (see the module docstring)."""

    objective: str = "steps_per_joule"
    weight: float = 0.5
    """``weighted``: the share of steps/s (the rest is steps/J)."""
    warmup_s: float = 5.0
    """Warm-up after a change that starts processes (actors, GMIs); a change the running
    processes take (batch or chunk size) is measured as soon as it has taken effect."""
    window_s: float = 10.0
    """A window's floor: it lasts at least this long (``autotune.tuning.windows``)."""
    window_max_s: float = 30.0
    """A window's ceiling: it ends by then even if its estimate is not yet precise."""
    window_target: float = 0.03
    """A window ends once its estimate's 95 % interval is within this share."""
    trials: int = 30
    repeat_every: int = 5
    recheck_s: float = 120.0
    drift_tol: float = 0.15
    saturation_gain: float = 0.05
    min_steps_per_s: float | None = None
    max_policy_lag: float | None = None
    sampler: str = "model"
    settle_timeout_s: float = 180.0
    """A config that has not taken effect after this long is failed."""
    empty_windows: int = 3
    """A config under which this many windows in a row trained nothing is failed (it stalls
    training); an empty window is measured again before that."""

    def problems(self) -> list[str]:
        out = []
        if self.objective not in OBJECTIVES:
            out.append(f"objective={self.objective!r}: allowed {OBJECTIVES}")
        if self.sampler not in SAMPLERS:
            out.append(f"sampler={self.sampler!r}: allowed {SAMPLERS}")
        if not 0.0 <= self.weight <= 1.0:
            out.append(f"weight={self.weight}: must be in 0..1")
        if not self.window_s <= self.window_max_s:
            out.append(
                f"window_s={self.window_s} > window_max_s={self.window_max_s}: the floor must "
                "not exceed the ceiling"
            )
        if not 0 < self.window_target < 1:
            out.append(f"window_target={self.window_target}: a share in (0, 1), e.g. 0.03")
        for name in ("warmup_s", "window_s", "window_max_s", "recheck_s"):
            if not getattr(self, name) > 0:
                out.append(f"{name}={getattr(self, name)}: must be > 0")
        if self.min_steps_per_s is not None and not self.min_steps_per_s > 0:
            out.append(f"min_steps_per_s={self.min_steps_per_s}: must be > 0")
        if self.max_policy_lag is not None and not 0 <= self.max_policy_lag < math.inf:
            out.append(
                f"max_policy_lag={self.max_policy_lag}: a ceiling is a finite number of "
                "versions >= 0 (a policy lag is never negative)"
            )
        for name in ("trials", "repeat_every", "empty_windows"):
            if getattr(self, name) < 1:
                out.append(f"{name}={getattr(self, name)}: must be >= 1")
        return out


def objective_value(
    settings: TunerSettings, m: Measurement, reference: Measurement | None = None
) -> float:
    """The value told to Optuna for window ``m`` (``reference``: the first trial's window, for
    ``weighted``; ``m`` itself when None)."""
    spj = m.steps_per_joule or 0.0
    if settings.objective == "steps_per_s":
        return m.steps_per_s
    if settings.objective == "steps_per_joule":
        return spj
    if settings.objective == "goodput_per_joule":  # without a noise scale: steps per joule
        return spj * (1.0 if m.efficiency is None else m.efficiency)
    ref = reference or m
    return weighted(settings.weight, m.steps_per_s, spj, (ref.steps_per_s, ref.steps_per_joule))


def weighted(weight: float, steps_per_s: Any, steps_per_joule: Any, reference: Any) -> Any:
    """``weighted``'s value: ``weight`` times steps/s plus the rest times steps/J, each relative
    to the ``reference`` window's (its steps/s and steps/J; a term whose reference figure is 0
    or missing counts 0). Numbers or arrays: the model sampler rates its predictions by it."""
    ref_s, ref_j = reference
    rel_s = steps_per_s / ref_s if ref_s else 0.0 * steps_per_s
    rel_j = steps_per_joule / ref_j if ref_j else 0.0 * steps_per_joule
    return weight * rel_s + (1 - weight) * rel_j


def first_window(done: list[Any]) -> tuple[float, float] | None:
    """A ``weighted`` study's reference: the steps/s and steps/J of the first of its completed
    trials ``done`` (in order) that measured a window, as a resumed tuner takes it
    (``autotune.tuning.job.restore_history``); None before any."""
    for t in done:
        if "steps_per_s" in t.user_attrs:
            return t.user_attrs["steps_per_s"], t.user_attrs.get("steps_per_joule") or 0.0
    return None


def constraint_values(settings: TunerSettings, m: Measurement) -> dict[str, float]:
    """Optuna constraint values (<= 0 is feasible): throughput floor, lag ceiling."""
    out = {}
    if settings.min_steps_per_s is not None:
        out["min_steps_per_s"] = settings.min_steps_per_s - m.steps_per_s
    if settings.max_policy_lag is not None:
        out["max_policy_lag"] = m.policy_lag - settings.max_policy_lag
    return out
