"""``autotune train --tune``: the online tuner driving a running job, through the daemon when
one answers (``autotune.control.job_link``), else in this process (``RunnerJob``).

``TuneOptions`` is what the ``--tune`` flags say; ``start_tuning`` turns them into a
``Tuning`` the training loop ticks and finishes.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
from dataclasses import dataclass
from typing import Any, Protocol

from autotune.control import protocol
from autotune.control.allocator import DEFAULT_MIN_SHARE, MIN_GMI_PCT, Budget
from autotune.control.cores import parse_cores
from autotune.control.job_link import DaemonLink, DaemonRefused, ask_offer
from autotune.control.pinning import pin_tree
from autotune.tuning.knobs import Knob, Machine, build_space, knobs_to_wire
from autotune.tuning.model_inputs import machine_from_doc
from autotune.tuning.model_sampler import sampler_for
from autotune.tuning.online_tuner import OnlineTuner
from autotune.tuning.perf_model import MachineModel
from autotune.tuning.runner_job import RunnerJob, TunableRunner, knob_values, tuning_doc
from autotune.tuning.settings import TunerSettings
from autotune.tuning.sizing import DEFAULT_LAG_CEILING
from autotune.tuning.storage import (
    StudyError,
    check_choices,
    open_study,
    sqlite_file,
    storage_url,
)
from autotune.workflows.auto_size import probed_model
from autotune.workflows.study_workload import check_workload
from runtime.config import TrainConfig
from runtime.hw.gpus import no_gpu_reason, nvml_index

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class TuneOptions:
    """How ``train --tune`` tunes (the flags of ``autotune train``'s tuning group)."""

    knobs: tuple[str, ...] = ()
    """``NAME=SPEC`` overrides of the knob space (``autotune.tuning.knobs.build_space``)."""
    objective: str = "steps_per_joule"
    storage: str = "sqlite:///autotune.db"
    study: str | None = None
    """The study's name (None: ``online-<env>``)."""
    trials: int = 30
    window_s: float | None = None
    """Measurement window per trial (None: 10 s with a GPU, 5 s without)."""
    warmup_s: float = 5.0
    sampler: str = "model"
    window_max_s: float = 30.0
    window_target: float = 0.03
    control: str | None = None
    """The daemon's control endpoint (None: ``$AUTOTUNE_CONTROL`` or the private default)."""
    in_process: bool = False
    """Tune in this process even if a daemon answers."""
    min_steps_per_s: float | None = None
    max_policy_lag: float | None = DEFAULT_LAG_CEILING
    weight: float = 1.0
    """This job's weight when the daemon shares the machine out."""
    min_share: float = DEFAULT_MIN_SHARE
    """Its fairness floor: this share of what the weighted equal split would give it."""
    exclusive: bool = False
    cores: str | None = None
    """A fixed budget's cores (``0-3,8``); None: the allocator decides."""
    gpu_share: int | None = None
    """With ``cores``: a fixed MPS share of the GPU, in percent."""

    def claim(self, cfg: TrainConfig, offer: bool = False) -> dict[str, Any]:
        """This job's claim on the machine, as the daemon reads it (``claims.claim_from``).
        ``offer``: asked before the job sizes itself, when it may still take the GPU the daemon
        picks (``"gpu": "any"``, where no GPU is chosen yet: no ``--gpus`` and no
        ``CUDA_VISIBLE_DEVICES``); otherwise the GPU its GMIs run on, as an NVML index.

        Raises:
            ValueError: a malformed ``cores``, or ``gpu_share`` without ``cores``.
        """
        if not (math.isfinite(self.weight) and self.weight > 0):
            raise ValueError(f"--weight {self.weight}: a positive number")
        if not 0.0 <= self.min_share <= 1.0:
            raise ValueError(f"--min-share {self.min_share}: a share within 0..1")
        if self.gpu_share is not None and self.cores is None:
            raise ValueError("--gpu-share fixes a budget's GPU share: give --cores with it")
        if self.gpu_share is not None and not MIN_GMI_PCT <= self.gpu_share <= 100:
            raise ValueError(
                f"--gpu-share {self.gpu_share}: a share of the SMs, {MIN_GMI_PCT}..100 (a GMI "
                f"runs at {MIN_GMI_PCT} % at least)"
            )
        gpu: int | str | None = None
        if no_gpu_reason() is None:
            free = offer and cfg.gpus is None and "CUDA_VISIBLE_DEVICES" not in os.environ
            gpu = "any" if free else nvml_index(cfg.gpus[0] if cfg.gpus else 0)
        if self.cores is not None and gpu is not None and self.gpu_share is None:
            raise ValueError(
                "on a machine with a GPU a fixed budget names its share of the GPU: give "
                f"--gpu-share PCT ({MIN_GMI_PCT}..100) with --cores"
            )
        return {
            "weight": self.weight,
            "min_share": self.min_share,
            "exclusive": self.exclusive,
            "cores": None if self.cores is None else list(parse_cores(self.cores)),
            "mps_pct": self.gpu_share,
            "gpu": gpu,
        }


class Tuning(Protocol):
    """How ``train --tune`` is tuned: in this process or by the daemon."""

    where: str

    def tick(self) -> None:
        """Moves the tuning on; called every runner tick, never blocks."""

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
    def __init__(self, link: DaemonLink) -> None:
        self.link = link
        self.where = f"daemon on {link.endpoint}"

    def tick(self) -> None:
        self.link.tick()

    def finish(self) -> dict[str, Any] | None:
        doc = self.link.close()
        if doc is not None:
            doc["registrations"] = self.link.registrations
        return doc


def tuner_settings(options: TuneOptions, gpus: bool) -> TunerSettings:
    """The tuner's settings from ``options`` (a window of 10 s by default on a GPU machine, 5 s
    without one).

    Raises:
        ValueError: listing every setting out of range, with what is allowed.
    """
    window = options.window_s  # an explicit 0 is refused below, not taken as the default
    window = (10.0 if gpus else 5.0) if window is None else window
    settings = TunerSettings(
        objective=options.objective,
        warmup_s=options.warmup_s,
        window_s=window,
        window_max_s=max(window, options.window_max_s),
        window_target=options.window_target,
        trials=options.trials,
        min_steps_per_s=options.min_steps_per_s,
        max_policy_lag=options.max_policy_lag,
        sampler=options.sampler,
    )
    problems = settings.problems()
    if problems:
        raise ValueError("invalid tuning settings: " + "; ".join(problems))
    return settings


def start_tuning(
    options: TuneOptions,
    cfg: TrainConfig,
    runner: TunableRunner,
    sizing: dict[str, Any] | None = None,
    held: Budget | None = None,
) -> Tuning:
    """The tuning of ``train --tune``: registered with the daemon if one answers (unless
    ``in_process``), else an ``OnlineTuner`` here. The ``model`` sampler uses the machine
    model of ``sizing`` (the result's section), or probes the workload now without one.

    Raises:
        ValueError: ``KnobError``, ``StudyError`` (a study of another workload among them:
            ``check_workload``), bad settings, a control endpoint that is not allowed, or the
            daemon's refusal; nothing has started then.
    """
    machine = Machine.here()
    if held is not None:  # pinned to the daemon's offer: its budget may grow to every core
        machine = Machine(max(machine.cores, os.cpu_count() or 1), machine.gpus)
    if cfg.cluster is not None:  # the actor knob ranges over the CPUs the nodes offer
        from runtime.cluster import cluster_cpus

        machine = Machine(cluster_cpus(cfg.cluster)[0], machine.gpus)
    space = build_space(
        machine,
        list(options.knobs),
        cfg.learner.minibatches,
        cfg.rollout_len,
        cfg.learner.min_minibatch,
    )
    settings = tuner_settings(options, bool(machine.gpus))
    storage = storage_url(options.storage)
    study_name = options.study or f"online-{cfg.env}"
    made = _open_here(options, storage, study_name, cfg.seed)  # before any probe
    if made is not None:
        check_workload(made, cfg)
    base = knob_values(cfg, {k: v for k, v in space.items() if v.online}, machine.gpus > 0)
    defaults = knob_values(cfg, space, machine.gpus > 0)
    model = _machine(cfg, sizing) if settings.sampler == "model" else None
    if not options.in_process:
        hello = {
            "env": cfg.env,
            "storage": storage,
            "study": study_name,
            "seed": cfg.seed,
            "settings": dataclasses.asdict(settings),
            "knobs": knobs_to_wire(space),
            "base": base,
            "defaults": defaults,
            "machine": dataclasses.asdict(model) if model else None,
            "claim": options.claim(cfg),
            "minibatches": cfg.learner.minibatches,
            "held": held.to_dict() if held else None,
        }
        link = DaemonLink(protocol.resolve_endpoint(options.control), hello, runner)
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
    sampler = None
    if model is not None:
        sampler = sampler_for(model, space, defaults, settings, cfg.seed)
    study = open_study(storage, study_name, seed=cfg.seed, grid=grid, sampler=sampler)
    check_choices(study, {k.name: k.choices for k in space.values()})
    tuner = OnlineTuner(study, space, RunnerJob(runner), settings, base, defaults=defaults)
    return InProcessTuning(tuner, space)


def _open_here(options: TuneOptions, storage: str, name: str, seed: int) -> Any:
    """The study, opened in this process (a SQLite file is made here: a daemon makes none for a
    message); None for a database server a daemon is to open that cannot be opened here (the
    daemon says why, as it opens it).

    Raises:
        StudyError: the study cannot be opened, tuning in this process or on a SQLite file.
    """
    try:
        return open_study(storage, name, seed=seed)
    except StudyError:
        if options.in_process or sqlite_file(storage) is not None:
            raise
        return None


def _machine(cfg: TrainConfig, sizing: dict[str, Any] | None) -> MachineModel:
    """The machine model from the run's sizing, or from probes taken now.

    Raises:
        ValueError: the workload could not be probed.
    """
    if sizing is not None:
        return machine_from_doc(sizing["model"])
    from runtime.probes import ProbeError

    try:
        return probed_model(cfg)
    except ProbeError as exc:
        raise ValueError(f"the model sampler could not probe the workload: {exc}") from None


def take_offer(options: TuneOptions, cfg: TrainConfig) -> tuple[Budget, dict[str, float]] | None:
    """Before a tuned job sizes itself: the budget a running daemon would give it and the
    shares of the machine's energy it would be charged, with this process pinned to the
    budget's cores (so ``auto`` sizing sizes inside it); None with no daemon, or with
    ``in_process``.

    Raises:
        ValueError: a malformed claim, or the daemon cannot take the job (with what is free).
    """
    if options.in_process:
        return None
    claim = options.claim(cfg, offer=True)
    try:
        offer = ask_offer(protocol.resolve_endpoint(options.control), claim)
    except DaemonRefused as exc:
        raise ValueError(f"the daemon cannot take this job: {exc}") from None
    if offer is not None:
        pin_tree(os.getpid(), offer[0].cores)
        if cfg.gpus is None:
            use_gpu(offer[0].gpu)
    return offer


def use_gpu(gpu: int | None) -> None:
    """Makes ``gpu`` (an NVML index, as the daemon counts) this process's CUDA device 0, and
    so its probes', GMIs' and spares' (they inherit the variables), before anything here
    starts CUDA; where ``CUDA_VISIBLE_DEVICES`` is set already, it stands (and is said)."""
    if gpu is None:
        return
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        os.environ["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"  # CUDA counts as NVML does
        os.environ["CUDA_VISIBLE_DEVICES"] = str(gpu)
    elif visible.split(",")[0].strip() != str(gpu):
        logger.warning(
            "the daemon's budget is on GPU %d, but CUDA_VISIBLE_DEVICES=%s is set: the GMIs "
            "run where it says, and the job is charged GPU %d's energy",
            gpu,
            visible,
            gpu,
        )
