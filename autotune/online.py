"""``autotune train --tune``: the online tuner driving a running ``Runner`` in-process.

``RunnerJob`` adapts a runner to ``autotune.tuner.Job``. A config is applied with
``Runner.reconfigure`` and has taken effect once ``Runner.settled``. A window measures
trained steps, the energy meter's GPU and CPU joules, and the policy lag of the steps trained
inside it. ``add_tune_args`` and ``tuner_from_args`` are the CLI's side.
"""

from __future__ import annotations

import argparse
import time
from typing import TYPE_CHECKING, Any

from autotune.knobs import Knob, to_config_value
from runtime.config import TrainConfig

if TYPE_CHECKING:  # optuna is imported only when tuning
    from autotune.tuner import Measurement, OnlineTuner

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
        return self.runner.settled()

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
        from autotune.tuner import Measurement

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


def add_tune_args(parser: argparse.ArgumentParser) -> None:
    """The ``--tune`` flags of ``autotune train``."""
    tune = parser.add_argument_group(
        "online tuning (--tune)",
        "move the live knobs of this run toward the objective while it trains; every trial is "
        "kept in an Optuna study (a rerun with the same --storage and --study resumes it)",
    )
    tune.add_argument("--tune", action="store_true", help="tune this run online")
    tune.add_argument(
        "--knob",
        action="append",
        default=None,
        metavar="NAME=SPEC",
        help="fix or narrow a knob: NAME=VALUE, NAME=LOW..HIGH or NAME=A,B (repeatable); "
        "knobs: actors, envs_per_actor, rollout_len, batch_size, chunk_bytes, trainers, "
        "mps_pct, trainer_device, inference, trainer_threads",
    )
    tune.add_argument(
        "--objective",
        choices=["steps_per_joule", "steps_per_s", "weighted"],  # autotune.tuner.OBJECTIVES
        default="steps_per_joule",
        help="what to maximise (default steps_per_joule)",
    )
    tune.add_argument(
        "--storage",
        default="sqlite:///autotune.db",
        help="Optuna RDB storage URL (any SQLAlchemy URL; default sqlite:///autotune.db)",
    )
    tune.add_argument("--study", default=None, help="study name (default online-<env>)")
    tune.add_argument(
        "--tune-trials", type=int, default=30, help="trials before holding the best (default 30)"
    )
    tune.add_argument(
        "--tune-window-s",
        type=float,
        default=None,
        help="measurement window per trial (default 10 with a GPU, 5 without)",
    )
    tune.add_argument(
        "--tune-warmup-s", type=float, default=5.0, help="warm-up after a change (default 5)"
    )
    tune.add_argument(
        "--min-steps-per-s", type=float, default=None, help="throughput floor (constraint)"
    )
    tune.add_argument(
        "--max-lag", type=float, default=None, help="policy-lag ceiling, versions (constraint)"
    )


def tuner_from_args(
    args: argparse.Namespace, cfg: TrainConfig, runner: Any
) -> tuple[OnlineTuner, dict[str, Knob]]:
    """The tuner for ``train --tune``: the knob space, the study and the runner as its job."""
    from autotune.energy import EnergyMeter
    from autotune.knobs import Machine, build_space
    from autotune.tuner import OnlineTuner, TunerSettings, open_study

    machine = Machine.here()
    space = build_space(machine, args.knob)
    window = args.tune_window_s or (10.0 if machine.gpus else 5.0)
    settings = TunerSettings(objective=args.objective, warmup_s=args.tune_warmup_s,
                             window_s=window, trials=args.tune_trials,
                             min_steps_per_s=args.min_steps_per_s,
                             max_policy_lag=args.max_lag)  # fmt: skip
    study = open_study(args.storage, args.study or f"online-{cfg.env}", seed=cfg.seed)
    meter = runner.meter = EnergyMeter()
    base = knob_values(cfg, {k: v for k, v in space.items() if v.online})
    tuner = OnlineTuner(study, space, RunnerJob(runner, meter), settings, base)
    return tuner, space
