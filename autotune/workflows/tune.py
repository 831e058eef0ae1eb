"""``autotune train --tune``: the online tuner driving a running ``Runner``, through the daemon
when one runs (``autotune.control.job_link``), else in this process.

``RunnerJob`` adapts a runner to ``autotune.tuning.online_tuner.Job`` in-process. A config is applied with
``Runner.reconfigure`` and has taken effect once ``Runner.settled``. A window measures
trained steps, the energy meter's GPU and CPU joules, and the policy lag of the steps trained
inside it (``autotune.tuning.counters``). ``add_tune_args`` and ``start_tuning`` are the CLI's side.
"""

from __future__ import annotations

import argparse
import dataclasses
from typing import TYPE_CHECKING, Any, Protocol

from autotune.tuning.counters import Counters, Measurement, measure, read_counters
from autotune.tuning.knobs import Knob, to_config_value
from autotune.tuning.settings import OBJECTIVES, SAMPLERS, TunerSettings
from runtime.config import TrainConfig

if TYPE_CHECKING:  # optuna is imported only when tuning
    from autotune.tuning.online_tuner import OnlineTuner


def knob_values(cfg: TrainConfig, knobs: dict[str, Knob]) -> dict[str, Any]:
    """The current values of the knobs in knob terms (``mps_pct`` None -> 100)."""
    out = {}
    for name in knobs:
        value = getattr(cfg, name)
        out[name] = (100 if value is None else value[0]) if name == "mps_pct" else value
    return out


class RunnerJob:
    """A running ``runtime.runner.Runner`` as the tuner's ``Job``."""

    def __init__(self, runner: Any) -> None:
        self.runner = runner
        self._start: Counters | None = None

    def apply(self, values: dict[str, Any]) -> None:
        self.runner.reconfigure(**config_changes(values))

    def ready(self) -> bool:
        return self.runner.settled()

    def begin_window(self) -> None:
        self._start = read_counters(self.runner)

    def end_window(self) -> Measurement:
        return measure(self._start, read_counters(self.runner))


def config_changes(values: dict[str, Any]) -> dict[str, Any]:
    """``Runner.reconfigure`` arguments for knob values."""
    changes = {name: to_config_value(name, v) for name, v in values.items()}
    if changes.get("trainer_device") == "cpu":
        changes["mps_pct"] = None  # percentages belong to cuda GMIs
    return changes


def tuning_doc(tuner: OnlineTuner, space: dict[str, Knob]) -> dict[str, Any]:
    """The result's ``tuning`` section: the knobs, the best config and every window."""
    return {
        "study": tuner.study.study_name,
        "objective": tuner.settings.objective,
        "sampler": tuner.settings.sampler,
        "knobs": {
            k.name: {
                "choices": list(k.choices),
                "apply": k.apply,
                "tuned": k.online,
                "unavailable": k.unavailable,
            }
            for k in space.values()
        },
        "default": tuner.base,
        "best": tuner.best(),
        "unmet": tuner.unmet,
        "trials": tuner.trials_done,
        "windows": tuner.log,
    }


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
        "mps_pct, trainer_device, inference, trainer_threads; tuned only when named: "
        "trainer_precision (fp32,bf16), actor_nice (0,5,10; any of 0..19)",
    )
    tune.add_argument(
        "--objective",
        choices=list(OBJECTIVES),
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
        "--tune-sampler",
        choices=list(SAMPLERS),
        default="tpe",
        help="tpe (default), or grid: every combination of the tuned knobs once, the baseline "
        "a tuner is compared with",
    )
    tune.add_argument(
        "--control",
        default=None,
        help="the daemon's control endpoint (default $AUTOTUNE_CONTROL or the private ipc "
        "socket of 'autotune daemon start')",
    )
    tune.add_argument(
        "--in-process",
        action="store_true",
        help="tune in this process even if a daemon runs",
    )
    tune.add_argument(
        "--min-steps-per-s", type=float, default=None, help="throughput floor (constraint)"
    )
    tune.add_argument(
        "--max-lag", type=float, default=None, help="policy-lag ceiling, versions (constraint)"
    )


class Tuning(Protocol):
    """How ``train --tune`` is tuned: in this process or by the daemon."""

    where: str

    def tick(self) -> None: ...

    def finish(self) -> dict[str, Any] | None:
        """Ends tuning (a trial being measured is failed as interrupted); the result's
        ``tuning`` section."""


class InProcessTuning:
    where = "in-process"

    def __init__(self, tuner: OnlineTuner, space: dict[str, Knob]) -> None:
        self.tuner, self.space = tuner, space

    def tick(self) -> None:
        self.tuner.tick()

    def finish(self) -> dict[str, Any]:
        self.tuner.close("job ended")
        return tuning_doc(self.tuner, self.space)


class DaemonTuning:
    def __init__(self, link: Any) -> None:
        self.link = link
        self.where = f"daemon on {link.endpoint}"

    def tick(self) -> None:
        self.link.tick()

    def finish(self) -> dict[str, Any] | None:
        doc = self.link.close()
        if doc is not None:
            doc["registrations"] = self.link.registrations
        return doc


def start_tuning(args: argparse.Namespace, cfg: TrainConfig, runner: Any) -> Tuning:
    """The tuning of ``train --tune``: registered with the daemon if one answers (unless
    ``--in-process``), else an ``OnlineTuner`` here.

    Raises:
        ValueError: ``KnobError``, ``StudyError``, bad settings, a control endpoint that is not
            allowed, or the daemon's refusal; nothing has started then.
    """
    from autotune.tuning.knobs import Machine, build_space
    from autotune.tuning.online_tuner import OnlineTuner
    from autotune.tuning.storage import open_study, storage_url

    machine = Machine.here()
    space = build_space(machine, args.knob)
    window = args.tune_window_s or (10.0 if machine.gpus else 5.0)
    settings = TunerSettings(
        objective=args.objective,
        warmup_s=args.tune_warmup_s,
        window_s=window,
        trials=args.tune_trials,
        min_steps_per_s=args.min_steps_per_s,
        max_policy_lag=args.max_lag,
        sampler=args.tune_sampler,
    )
    problems = settings.problems()
    if problems:
        raise ValueError("invalid tuning settings: " + "; ".join(problems))
    storage = storage_url(args.storage)
    study_name = args.study or f"online-{cfg.env}"
    base = knob_values(cfg, {k: v for k, v in space.items() if v.online})
    if not args.in_process:
        from autotune.control import protocol
        from autotune.control.daemon import knobs_to_wire
        from autotune.control.job_link import DaemonLink, DaemonRefused

        hello = {
            "env": cfg.env,
            "storage": storage,
            "study": study_name,
            "seed": cfg.seed,
            "settings": dataclasses.asdict(settings),
            "knobs": knobs_to_wire(space),
            "base": base,
        }
        link = DaemonLink(protocol.resolve_endpoint(args.control), hello, runner)
        try:
            if link.register():
                return DaemonTuning(link)
        except DaemonRefused as exc:
            link.close()
            raise ValueError(f"the daemon refused this job: {exc}") from None
        link.close()
    grid = (
        {k.name: list(k.choices) for k in space.values() if k.online}
        if settings.sampler == "grid"
        else None
    )
    study = open_study(storage, study_name, seed=cfg.seed, grid=grid)
    return InProcessTuning(OnlineTuner(study, space, RunnerJob(runner), settings, base), space)
