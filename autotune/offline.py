"""``autotune study``: many short training runs, one fresh run per trial, on an Optuna study.

Unlike the online tuner, a trial here is a whole new ``autotune train`` run, so every knob can
move, the ones that need a new run included (rollout length, inference placement). Each run
lasts ``trial_s``; its figures are read from the run's timeline from ``warmup_s`` after its
first trained step (start-up and the first updates left out), so trials compare fairly. A config the
runtime refuses (``TrainConfig.validate``) is a failed trial marked "not runnable" and never
tried again; a run that fails is a failed trial with its error. The study is in RDB storage
and resumes when run again; a trial cut by Ctrl-C is failed as interrupted.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from typing import Any

from autotune.knobs import Knob
from autotune.online import config_changes
from autotune.study import (
    fail_config,
    fail_interrupted,
    fail_orphans,
    failed_configs,
    skip_if_failed,  # fmt: skip
)
from runtime.config import ConfigError, TrainConfig

logger = logging.getLogger(__name__)

OBJECTIVES = ("steps_per_joule", "steps_per_s")


@dataclasses.dataclass
class TrialResult:
    number: int
    values: dict[str, Any]
    objective: float | None = None
    steps_per_s: float | None = None
    steps_per_joule: float | None = None
    gpu_w: float | None = None
    cpu_w: float | None = None
    lost_steps: int | None = None
    error: str | None = None


def run_config(cfg: TrainConfig, warmup_s: float) -> tuple[dict[str, Any], dict[str, Any]]:
    """One quiet training run of ``cfg``; returns its result and its rates from ``warmup_s``
    after its first trained step to its end (process start-up is left out, however long).

    Raises:
        ConfigError: the config cannot run here.
        runtime.runner.RunError: the run failed, or trained too little to be measured.
    """
    from runtime.results import timeline_rate
    from runtime.runner import RunError, Runner

    info = cfg.validate()
    result = Runner(cfg, info).run()
    rows = result["timeline"]["rows"]
    first = next((r[0] for r in rows if r[1] > 0), None)
    rate = None if first is None else timeline_rate(result, first + warmup_s, result["wall_s"])
    if rate is None or not rate["steps_per_s"] > 0:
        raise RunError(f"trained too little to measure: {result['env_steps']} steps, the first "
                       f"after {first if first is None else round(first, 1)} s of "
                       f"{result['wall_s']:.0f} s; give a --trial-s of at least warm-up "
                       f"({warmup_s:g} s) + 10 s after training starts")  # fmt: skip
    return result, rate


class OfflineStudy:
    """Asks, runs and tells one trial at a time (see the module docstring).

    Args:
        study: The Optuna study (maximize).
        space: The knobs; every one with several choices that applies here is tuned.
        base: The config each trial starts from (its ``max_wall_s`` is the trial length).
        warmup_s: Seconds of each run left out of its figures.
        objective: ``steps_per_joule`` or ``steps_per_s``.
        run: How a config is run (injectable for tests).
    """

    def __init__(self, study: Any, space: dict[str, Knob], base: TrainConfig, warmup_s: float,
                 objective: str = "steps_per_joule",
                 run: Callable[[TrainConfig, float], tuple[dict, dict]] = run_config,
                 ) -> None:  # fmt: skip
        if objective not in OBJECTIVES:
            raise ValueError(f"objective={objective!r}: allowed {OBJECTIVES}")
        self.study, self.base, self.warmup_s, self.objective, self._run = (
            study, base, warmup_s, objective, run)  # fmt: skip
        self.knobs = [k for k in space.values() if k.unavailable is None and len(k.choices) > 1]
        self.fixed = {k.name: k.choices[0] for k in space.values()
                      if k.unavailable is None and len(k.choices) == 1}  # fmt: skip
        fail_orphans(study)
        self.failed = failed_configs(study)

    def step(self) -> TrialResult:
        """Runs one trial."""

        from runtime.runner import RunError

        trial = self.study.ask()
        values = {k.name: trial.suggest_categorical(k.name, list(k.choices)) for k in self.knobs}
        row = TrialResult(trial.number, values)
        if skip_if_failed(self.study, trial, values, self.failed):
            row.error = "skipped: failed before"
            return row
        try:
            cfg = dataclasses.replace(self.base, **config_changes({**self.fixed, **values}))
            result, rate = self._run(cfg, self.warmup_s)
        except ConfigError as exc:
            row.error = f"not runnable: {exc}"
        except RunError as exc:
            row.error = f"run failed: {exc}"
        except KeyboardInterrupt:
            fail_interrupted(self.study, trial, "Ctrl-C")
            raise
        if row.error is not None:
            fail_config(self.study, trial, values, row.error, self.failed)
            return row
        row.steps_per_s, row.steps_per_joule = rate["steps_per_s"], rate["steps_per_joule"]
        row.gpu_w, row.cpu_w, row.lost_steps = rate["gpu_w"], rate["cpu_w"], result["lost_steps"]
        row.objective = (row.steps_per_s if self.objective == "steps_per_s"
                         else row.steps_per_joule or 0.0)  # fmt: skip
        for name in ("steps_per_s", "steps_per_joule", "gpu_w", "cpu_w", "lost_steps"):
            trial.set_user_attr(name, getattr(row, name))
        trial.set_user_attr("cpu_source", result["energy"]["cpu_source"])
        self.study.tell(trial, row.objective)
        return row
