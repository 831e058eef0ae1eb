"""The interface every tuned job implements (``Job``: a runner in this process, a job
registered with the daemon, a wrapped script run live) and the tuner's memory of what each
config measured (``History``)."""

from __future__ import annotations

import json
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import optuna
from optuna.trial import TrialState

from autotune.tuning.counters import Counters
from autotune.tuning.storage import config_key, failed_configs
from policies.noise_scale import goodput_per_joule


class Job(Protocol):
    """What the tuner drives: a running training job (``autotune.tuning.runner_job.RunnerJob``)."""

    def apply(self, values: dict[str, Any]) -> None:
        """Asks for the config; raises ``runtime.config.ConfigError`` if it is refused."""

    def ready(self) -> bool:
        """Whether the last change has taken effect (actors replaced, GMIs handed over).
        Raises ``runtime.config.ConfigError`` if it was refused or failed after ``apply``
        (a job in another process answers later)."""

    def counters(self) -> Counters:
        """The job's totals now (the tuner reads them about once a second while it measures,
        and measures a window as the difference of two readings)."""


@dataclass
class Current:
    """The config the tuner has applied and where its measurement stands."""

    trial: optuna.trial.Trial | None
    values: dict[str, Any]
    phase: str
    since: float
    ready_at: float | None = None
    empty: int = 0
    warmup_s: float = 0.0
    samples: list[Counters] = field(default_factory=list)
    """Counter readings of the window being measured, about one a second."""
    return_before: float | None = None
    started: float = 0.0  # when the change was applied (a trial's length runs from here)
    change: str | None = None
    """How the change applied (``tuner_rules.change_kind``); None for the first config."""


@dataclass
class History:
    """Measurements by config (a JSON key of its knob values)."""

    by_config: dict[str, list[float]] = field(default_factory=dict)
    speed: dict[str, list[float]] = field(default_factory=dict)
    failed: set[str] = field(default_factory=set)
    rerate: bool = False
    """Goodput objective: rank configs at the newest noise scale, not at each window's own."""
    per_joule: dict[str, list[tuple[float, float]]] = field(default_factory=dict)
    """Each feasible window's (steps per joule, batch) by config, beside ``by_config``."""
    noise_scale: float | None = None
    """The learner's newest gradient noise scale (samples)."""
    infeasible: set[str] = field(default_factory=set)
    """Configs whose newest window broke a constraint: none is the best until one meets them."""

    def add(
        self, key: str, value: float, spj: float | None, batch: float | None, feasible=True
    ) -> None:
        """A window's objective ``value``, with its steps/J and batch to re-rate by; one that
        broke a constraint only marks its config ``infeasible``."""
        if not feasible:
            self.infeasible.add(key)
            return
        self.infeasible.discard(key)
        self.by_config.setdefault(key, []).append(value)
        if spj is not None and batch:
            self.per_joule.setdefault(key, []).append((spj, batch))

    def values(self, key: str) -> list[float]:
        """A config's windows, in order. With ``rerate``, each is its steps/J times the
        efficiency of its batch at the newest noise scale: the noise scale grows as a run learns
        (McCandlish et al.), so a big batch measured early, when it kept little of each
        sample's worth, would otherwise stay ranked at that forever (on Ant-v5 a goodput-tuned
        run held 4,096-sample batches to the end)."""
        values = self.by_config[key]
        pairs = self.per_joule.get(key, [])
        if self.rerate and self.noise_scale and len(pairs) == len(values):
            return [goodput_per_joule(spj, self.noise_scale, b) for spj, b in pairs]
        return values

    def score(self, key: str) -> float:
        """The median of a config's windows (``values``)."""
        return statistics.median(self.values(key))

    def best(self) -> tuple[str, float] | None:
        """The config with the best median, of those never failed for good whose newest
        window met the constraints."""
        out = self.failed | self.infeasible
        scored = [(k, self.score(k)) for k, v in self.by_config.items() if v and k not in out]
        return max(scored, key=lambda kv: kv[1]) if scored else None

    def envs_cap(self, values: dict[str, Any], gain: float) -> tuple[int, float] | None:
        """(envs_per_actor past which more envs stopped paying, the gain of that doubling)
        among configs like ``values`` in every other knob, or None (GMI-DRL's saturation)."""
        if "envs_per_actor" not in values:
            return None
        rest = {k: v for k, v in values.items() if k != "envs_per_actor"}
        speeds: dict[int, float] = {}
        for key, sps in self.speed.items():
            other = json.loads(key)
            envs = other.pop("envs_per_actor", None)
            if other == rest and envs is not None:
                speeds[envs] = statistics.median(sps)
        for envs in sorted(speeds):
            if 2 * envs in speeds and speeds[envs] > 0:
                up = speeds[2 * envs] / speeds[envs] - 1
                if up < gain:
                    return 2 * envs, up
        return None


def restore_history(
    study: optuna.Study,
    batch_of: Callable[[dict[str, Any]], int | None],
    keep: Callable[[dict[str, Any]], bool] | None = None,
) -> tuple[History, int, dict[str, Any] | None]:
    """A resumed study's history: (the medians' inputs, failed configs; the trials finished;
    the first measured trial's attributes, the reference of a ``weighted`` objective).
    ``batch_of``: the samples an update of a trial's tuned values trains, as the tuner counts
    them live (a batch size that is not tuned is the job's); ``keep``: whether a trial's params
    are of this tuner's space (others, run with a knob tuned that is fixed now, are left out:
    their values are not this job's to apply)."""
    history, done, reference = History(failed=failed_configs(study)), 0, None
    for t in study.get_trials(deepcopy=False):
        if t.state in (TrialState.RUNNING, TrialState.WAITING):  # not finished
            continue
        if keep is not None and not keep(t.params):
            continue
        done += 1
        key = config_key(t.params)
        if t.state != TrialState.COMPLETE:
            continue
        attrs = t.user_attrs
        if attrs.get("noise_scale"):
            history.noise_scale = attrs["noise_scale"]
        feasible = attrs.get("feasible", True)
        history.add(key, float(t.value), attrs.get("steps_per_joule"), batch_of(t.params), feasible)
        if "steps_per_s" in attrs:
            history.speed.setdefault(key, []).append(attrs["steps_per_s"])
            reference = reference or dict(attrs)
    return history, done, reference
