"""The two kinds of offline trial, each one fresh run measured: ``TrainTrials`` (an
``autotune train`` run of a config, measured from its timeline after a warm-up) and
``ScriptTrials`` (a run of a wrapped script, measured by its wrapper).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any, Protocol

from autotune.tuning.counters import Counters
from autotune.tuning.knobs import Knob, knob_value
from autotune.tuning.reference import GOODPUT_METRIC, TARGET_METRIC
from autotune.tuning.runner_job import config_changes, update_steps
from autotune.tuning.windows import WindowRule, window_done
from runtime.config import ConfigError, TrainConfig
from runtime.energy import EnergyMeter
from runtime.results import timeline_rate
from runtime.runner import RunError, Runner


class ScriptRunner(Protocol):
    """What runs a wrapped script's trial: ``autotune.wrap.wrapper.Wrapper`` is one."""

    def run_trial(self, number: int, values: dict[str, Any]) -> Any:
        """One run of the script with ``values``; a ``TrialRun``."""


class TrialFailed(Exception):
    """A trial that could not be measured; the message says why. ``killed``: a signal from
    outside ended its run (the config is run once more before it counts as unrunnable)."""

    def __init__(self, message: str, killed: bool = False, too_short: bool = False) -> None:
        super().__init__(message)
        self.killed = killed
        self.too_short = too_short
        """The run ended before its window could be measured (``--trial-s``, not the config)."""


class TooShort(RunError):
    """A trial's run that trained too little to measure."""


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


TRIAL_WINDOW = WindowRule(floor_s=10.0, ceiling_s=math.inf, target=0.03)
"""When a train trial's measured window (from ``warmup_s`` after its first trained step) knows
enough: at least 10 s, and its steps/J estimate's 95 % interval within 3 %
(``autotune.tuning.windows``). The run then drains and ends; its wall limit (``--trial-s``)
is the longest it runs, on a machine too loaded to get there sooner."""


def measured_window(rows: list[list[float]], warmup_s: float) -> list[Counters]:
    """A run's timeline rows (``runtime.results.Timeline``) from ``warmup_s`` after its first
    trained step, as counter readings."""
    first = next((r[0] for r in rows if r[1] > 0), None)
    if first is None:
        return []
    return [Counters(r[0], int(r[1]), 0.0, r[2], r[3]) for r in rows if r[0] >= first + warmup_s]


def run_config(
    cfg: TrainConfig,
    warmup_s: float,
    meter: EnergyMeter | None = None,
    rule: WindowRule | None = TRIAL_WINDOW,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """One quiet training run of ``cfg``; returns its result and its rates from ``warmup_s``
    after its first trained step to where its drain began (process start-up and the drain,
    which trains what is in flight with the actors stopped, are left out).
    The run ends once that window satisfies ``rule`` (None: at its wall limit), or at
    ``cfg.max_wall_s``. ``meter`` is the ``EnergyMeter`` to charge (default: the machine's).

    Raises:
        ConfigError: the config cannot run here.
        runtime.runner.RunError: the run failed, or trained too little to be measured.
    """
    info = cfg.validate()
    runner = Runner(cfg, info)
    runner.meter = meter
    drained_from: list[float] = []  # the last timeline sample before the drain began

    def stop_once_measured(state: Any) -> None:
        if state.draining:  # the window ends where the drain began: it trains with no actors
            if not drained_from and runner.timeline.rows:
                drained_from.append(runner.timeline.rows[-1][0])
            return
        samples = measured_window(runner.timeline.rows, warmup_s)
        if rule is not None and window_done(rule, samples, update_steps(cfg)):
            runner.stop_requested = True  # drains; the window's figures are complete
            drained_from[:] = drained_from or [samples[-1].t_s]

    runner.on_progress = stop_once_measured
    result = _unless_stopped(runner.run())
    rows = result["timeline"]["rows"]
    first = next((r[0] for r in rows if r[1] > 0), None)
    end = drained_from[0] if drained_from else result["wall_s"]
    rate = None if first is None else timeline_rate(result, first + warmup_s, end)
    if rate is None or not rate["steps_per_s"] > 0:
        raise TooShort(
            f"trained too little to measure: {result['env_steps']} steps, the first "
            f"after {first if first is None else round(first, 1)} s of "
            f"{result['wall_s']:.0f} s; give a --trial-s of at least warm-up "
            f"({warmup_s:g} s) + 10 s after training starts"
        )
    return result, rate


def run_to_target(cfg: TrainConfig, meter: EnergyMeter | None = None) -> dict[str, Any]:
    """One quiet training run of ``cfg`` (its ``target_return`` set) until its 100-episode
    mean return reaches the target, or its wall limit; its result (``target`` says which).

    Raises:
        ConfigError: the config cannot run here.
        runtime.runner.RunError: the run failed.
    """
    runner = Runner(cfg, cfg.validate())
    runner.meter = meter
    return _unless_stopped(runner.run())


def _unless_stopped(result: dict[str, Any]) -> dict[str, Any]:
    """A trial's run ``result``; raises ``KeyboardInterrupt`` where Ctrl-C or SIGTERM drained it
    (the run stops cleanly on the first): the study then fails the trial as interrupted, to
    be run again first, in its role (a cut default trial is still the study's first
    reference), and stops, as it does on Ctrl-C between runs."""
    if result.get("interrupted"):
        raise KeyboardInterrupt("the trial's run was stopped by a signal")
    return result


def target_measured(result: dict[str, Any]) -> Measured:
    """A run to a target as a trial's figures: whole-run steps/s and steps/J, and the joules,
    seconds and steps it took to the target (``TARGET_METRIC``: 1e6 over those joules, 0 for a
    run that did not get there, whose best return is kept)."""
    target = result.get("target") or {}
    joules = target.get("joules") if target.get("reached") else None
    wall = result["wall_s"]
    energy = result["energy"]
    attrs = {
        "target_return": target.get("return"),
        "reached": bool(target.get("reached")),
        "joules_to_target": joules,
        "seconds_to_target": target.get("seconds"),
        "steps_to_target": target.get("steps"),
        "best_return": target.get("best_return"),
        TARGET_METRIC: 1e6 / joules if joules else 0.0,
        "gpu_w": energy.get("gpu_w"),
        "cpu_w": energy.get("cpu_w"),
        "lost_steps": result["lost_steps"],
        "cpu_source": energy["cpu_source"],
        "window_s": wall,
    }
    steps_per_s = result["env_steps"] / wall if wall > 0 else 0.0
    return Measured(steps_per_s, result["steps_per_joule"] or 0.0, attrs)


def _tuned(space: dict[str, Knob] | list[Knob]) -> tuple[list[Knob], dict[str, Any]]:
    knobs = list(space.values()) if isinstance(space, dict) else list(space)
    usable = [k for k in knobs if k.unavailable is None]
    return (
        [k for k in usable if len(k.choices) > 1],
        {k.name: k.choices[0] for k in usable if len(k.choices) == 1},
    )


def _nearest(knob: Knob, value: Any) -> Any:
    if isinstance(value, list) and value:  # MPS shares that differ among the GMIs: the first's
        value = value[0]
    if value in knob.choices:
        return value
    if isinstance(value, int) and all(isinstance(c, int) for c in knob.choices):
        return min(knob.choices, key=lambda c: (abs(c - value), c))
    return knob.choices[0]


class TrainTrials:
    """Trials as ``autotune train`` runs of ``base`` changed by the knob values.

    Args:
        space: The knobs; every one with several choices that applies here is tuned.
        base: The config each trial starts from (its ``max_wall_s`` is the longest a trial
            runs; it ends sooner once measured, ``TRIAL_WINDOW``).
        warmup_s: Seconds after the first trained step left out of each run's figures.
        run: How a config is run (injectable for tests).
        meter: A factory of the ``EnergyMeter`` each run charges (None: the machine's).
        run_target: How a config is run to ``base.target_return``, where that is set: each
            trial then runs until it reaches the target or its wall limit
            (``target_measured``).
    """

    kind = "train"

    def __init__(
        self,
        space: dict[str, Knob],
        base: TrainConfig,
        warmup_s: float,
        run: Callable[..., tuple[dict, dict]] = run_config,
        meter: Callable[[], EnergyMeter] | None = None,
        run_target: Callable[..., dict[str, Any]] = run_to_target,
    ) -> None:
        self.base, self.warmup_s, self._run, self._meter = base, warmup_s, run, meter
        self._run_target = run_target
        self.knobs, self.fixed = _tuned(space)

    def default(self) -> dict[str, Any]:
        """The base config's knob values as a run of it takes them (``trainer_device`` auto is
        cuda where the knob offers it, a GPU being here, as ``TrainConfig.resolved_device``),
        the nearest choice where one is outside the space."""
        now = {k.name: knob_value(self.base, k.name, cuda="cuda" in k.choices) for k in self.knobs}
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
        try:
            cfg = dataclasses.replace(self.base, **config_changes({**self.fixed, **values}))
            meter = None if self._meter is None else self._meter()
            if cfg.target_return is not None:
                return target_measured(self._run_target(cfg, meter))
            result, rate = self._run(cfg, self.warmup_s, meter)
        except ConfigError as exc:
            raise TrialFailed(f"not runnable: {exc}") from None
        except RunError as exc:
            short = isinstance(exc, TooShort)
            raise TrialFailed(f"run failed: {exc}", killed=exc.killed, too_short=short) from None
        attrs = {
            "gpu_w": rate["gpu_w"],
            "cpu_w": rate["cpu_w"],
            "lost_steps": result["lost_steps"],
            "cpu_source": result["energy"]["cpu_source"],
        }
        if "to_s" in rate:  # a measured run's window (test doubles may not say)
            attrs["window_s"] = rate["to_s"] - rate["from_s"]
        efficiency = (result.get("noise_scale") or {}).get("efficiency")
        attrs["efficiency"] = efficiency
        attrs[GOODPUT_METRIC] = (rate["steps_per_joule"] or 0.0) * (efficiency or 0.0)
        return Measured(rate["steps_per_s"], rate["steps_per_joule"] or 0.0, attrs)


class ScriptTrials:
    """Trials as runs of a wrapped script (``autotune.wrap.wrapper.Wrapper``); scored per step it
    reports, or per run if it reports none."""

    kind = "script"

    def __init__(self, wrapper: ScriptRunner, space: list[Knob]) -> None:
        self.wrapper = wrapper
        self.knobs, self.fixed = _tuned(space)

    def default(self) -> dict[str, Any]:
        return {k.name: k.choices[0] for k in self.knobs}

    def profile_rows(self) -> list[list[dict[str, Any]]]:
        return []  # a script's knobs have no GMI or env meaning to profile by

    def __call__(self, number: int, values: dict[str, Any]) -> Measured:
        run = self.wrapper.run_trial(number, {**self.fixed, **values})
        if run.error is not None:
            code = run.returncode
            killed = code is not None and code < 0 and run.error == f"exited with code {code}"
            raise TrialFailed(run.error, killed=killed)
        attrs = {**run.attrs(self.wrapper.cmd), "cpu_source": "model"}
        return Measured(run.score("steps_per_s"), run.score("steps_per_joule"), attrs)
