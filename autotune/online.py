"""``autotune train --tune``: the online tuner driving a running ``Runner`` in-process.

``RunnerJob`` adapts a runner to ``autotune.tuner.Job``. A config is applied with
``Runner.reconfigure``. It has taken effect once no change is pending, no removed actor is
still delivering, every actor has stepped, and every GMI of the current generation has loaded
the learner state. A window measures trained steps, the energy meter's GPU and CPU joules, and
the policy lag of the steps trained inside it.
"""

from __future__ import annotations

import time
from typing import Any

from autotune.knobs import Knob, to_config_value
from autotune.tuner import Measurement, OnlineTuner
from runtime.config import TrainConfig

WINDOW_KEY = "tune-window"


def knob_values(cfg: TrainConfig, knobs: dict[str, Knob]) -> dict[str, Any]:
    """The current values of the knobs in knob terms (``mps_pct`` None -> 100)."""
    out = {}
    for name in knobs:
        value = getattr(cfg, name)
        out[name] = (100 if value is None else value[0]) if name == "mps_pct" else value
    return out


class RunnerJob:
    """A running ``runtime.runner.Runner`` as the tuner's ``Job``."""

    def __init__(self, runner: Any, meter: Any) -> None:
        self.runner, self.meter = runner, meter
        self._start: tuple[float, int, float] | None = None

    def apply(self, values: dict[str, Any]) -> None:
        changes = {name: to_config_value(name, v) for name, v in values.items()}
        if changes.get("trainer_device") == "cpu":
            changes["mps_pct"] = None  # percentages belong to cuda GMIs
        self.runner.reconfigure(**changes)

    def ready(self) -> bool:
        r = self.runner
        if r._pending_cfg is not None or r.actors.leaving:
            return False
        if any(slot.stepped.value == 0 for slot in r.actors.slots):
            return False  # a new actor is still starting
        gmis = [r.telemetry.source(name) for name in r.trainer_names()]
        return all(g.get("resumed") for g in gmis) and bool(gmis)

    def _lag_total(self) -> tuple[int, float]:
        tel = self.runner.telemetry
        steps = tel.trained_steps
        mean, _ = tel.policy_lag()
        return steps, mean * steps

    def begin_window(self) -> None:
        self.meter.begin_window(WINDOW_KEY)
        steps, lag = self._lag_total()
        self._start = (time.monotonic(), steps, lag)

    def end_window(self) -> Measurement:
        energy = self.meter.end_window(WINDOW_KEY)
        t0, steps0, lag0 = self._start
        span = time.monotonic() - t0
        steps, lag = self._lag_total()
        trained = steps - steps0
        total_j = energy.total_j
        return Measurement(
            steps_per_s=trained / span if span > 0 else 0.0,
            steps_per_joule=trained / total_j if total_j > 0 else None,
            gpu_j=energy.gpu_total_j, cpu_j=energy.cpu_energy_j,
            policy_lag=(lag - lag0) / trained if trained else 0.0, window_s=span,
        )  # fmt: skip


def tuning_doc(tuner: OnlineTuner, space: dict[str, Knob]) -> dict[str, Any]:
    """The result's ``tuning`` section: the knobs, the best config and every window."""
    return {
        "study": tuner.study.study_name,
        "objective": tuner.settings.objective,
        "knobs": {k.name: {"choices": list(k.choices), "apply": k.apply, "tuned": k.online,
                           "unavailable": k.unavailable} for k in space.values()},
        "default": tuner.base,
        "best": tuner.best(),
        "trials": tuner.trials_done,
        "windows": tuner.log,
    }  # fmt: skip
