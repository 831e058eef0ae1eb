"""A running ``runtime.runner.Runner`` as the online tuner's ``Job``, and the translation
between knob values and the runner's config.

A config is applied with ``Runner.reconfigure`` and has taken effect once ``Runner.settled``.
A window measures trained steps, the energy meter's GPU and CPU joules, and the policy lag of
the steps trained inside it (``autotune.tuning.counters``), read from the runner's telemetry
and the energy window it keeps open for the whole run.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, Protocol

from autotune.tuning.counters import Counters
from autotune.tuning.knobs import Knob, to_config_value
from runtime.config import TrainConfig
from runtime.runner import RUN_WINDOW

if TYPE_CHECKING:
    from autotune.tuning.online_tuner import OnlineTuner
    from runtime.energy import EnergyMeter
    from runtime.live import Plan
    from runtime.telemetry import RunTelemetry


class TunableRunner(Protocol):
    """What tuning needs of a running job: ``runtime.runner.Runner`` is one."""

    cfg: TrainConfig
    telemetry: RunTelemetry
    meter: EnergyMeter

    def reconfigure(self, **changes: Any) -> Plan:
        """Applies config changes live (raises ``ConfigError`` and changes nothing if refused)."""

    def settled(self) -> bool:
        """Whether the last change has taken effect everywhere."""


def knob_values(
    cfg: TrainConfig, knobs: dict[str, Any], cuda: bool | None = None
) -> dict[str, Any]:
    """The current values of the knobs named in ``knobs`` in knob terms (``mps_pct`` None ->
    100; ``trainer_device`` auto -> cuda where ``cuda``, a GPU here, else cpu; None: as
    ``TrainConfig.resolved_device`` finds it)."""
    out = {}
    for name in knobs:
        value = getattr(cfg, name)
        out[name] = (100 if value is None else value[0]) if name == "mps_pct" else value
    if out.get("trainer_device") == "auto":
        gpu = cfg.resolved_device() == "cuda" if cuda is None else cuda
        out["trainer_device"] = "cuda" if gpu else "cpu"
    return out


def update_steps(cfg: TrainConfig) -> int:
    """Steps one learner update of ``cfg`` trains: its batch for each trainer GMI, which train in
    lockstep (``TrainConfig.gmi_count``, without importing torch to resolve a device left to
    auto: one GPU's GMIs, or the GPUs it names)."""
    return (
        cfg.batch_size * cfg.trainers * (len(cfg.gpu_list()) if cfg.trainer_device != "cpu" else 1)
    )


def config_changes(values: dict[str, Any]) -> dict[str, Any]:
    """``Runner.reconfigure`` (or ``dataclasses.replace``) arguments for knob values."""
    changes = {name: to_config_value(name, v) for name, v in values.items()}
    if changes.get("trainer_device") == "cpu":
        changes["mps_pct"] = None  # percentages belong to cuda GMIs
    return changes


def read_counters(runner: TunableRunner) -> Counters:
    """Reads a running job: its telemetry and the energy window it keeps open for the run."""
    tel = runner.telemetry
    steps = tel.trained_steps
    mean_lag, _ = tel.policy_lag()
    energy = runner.meter.peek_window(RUN_WINDOW)
    return Counters(
        time.monotonic(),
        steps,
        mean_lag * steps,
        energy.gpu_total_j,
        energy.cpu_energy_j,
        energy.cpu_source,
        tel.return_mean,
        noise_scale=_noise_scale(tel),
        step_samples=float(update_steps(runner.cfg)),
        remaining_s=remaining_s(runner.cfg, energy.elapsed_s, steps),
        node_steps=_node_steps(runner),
    )


def _node_steps(runner: Any) -> dict[str, int] | None:
    """A cluster run's steps sampled per node (``Runner.cluster_nodes``); None without one."""
    nodes = getattr(runner, "cluster_nodes", lambda: None)()
    return {n["node"]: n["stepped"] for n in nodes} if nodes else None


def _noise_scale(tel: Any) -> float | None:
    """The lead trainer's last reported gradient noise scale (``policies.noise_scale``)."""
    value = tel.lead_trainer().get("noise_scale")
    return float(value) if isinstance(value, int | float) else None


def remaining_s(cfg: TrainConfig, elapsed_s: float, trained: int) -> float | None:
    """Seconds a run has left: to its wall limit, or to its step target at the rate so far,
    whichever is nearer; None when neither is near enough to say (no limit, nothing trained)."""
    left = []
    if cfg.max_wall_s is not None:
        left.append(max(cfg.max_wall_s - elapsed_s, 0.0))
    if trained > 0 and elapsed_s > 0:
        left.append(max(cfg.steps - trained, 0) * elapsed_s / trained)
    return min(left) if left else None


class RunnerJob:
    """A running job in this process as the tuner's ``Job``."""

    def __init__(self, runner: TunableRunner) -> None:
        self.runner = runner

    def apply(self, values: dict[str, Any]) -> None:
        self.runner.reconfigure(**config_changes(values))

    def ready(self) -> bool:
        return self.runner.settled()

    def counters(self) -> Counters:
        return read_counters(self.runner)


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
