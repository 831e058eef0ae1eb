"""The result document of one run (what ``autotune train --json`` writes).

It is built from a ``RunRecord``, what this module reads of a finished run;
``runtime.runner.Runner`` is one (the runner imports this module, never the other way round).
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any, Protocol

from runtime import checkpoint
from runtime.hw.gpus import known_nvml_index
from runtime.inference import NAME as INFERENCE
from runtime.services import PIPELINE, RunError
from runtime.time_spent import actor_time, actor_waits, cpu_time

if TYPE_CHECKING:  # only named in RunRecord's annotations
    from runtime.actor_pool import Incarnations
    from runtime.config import TrainConfig
    from runtime.gmi.fleet import GMIFleet
    from runtime.phases import PhaseLog
    from runtime.supervisor import Supervisor
    from runtime.telemetry import RunTelemetry

logger = logging.getLogger(__name__)

TIMELINE_S = 2.0
"""How often a run's timeline samples trained steps and joules."""


class Timeline:
    """Cumulative trained steps, GPU J, CPU J and the actors' seconds waiting on their
    in-flight budget every ``TIMELINE_S`` of a run, so any span of it can be measured
    afterwards (``timeline_rate``)."""

    COLUMNS = ("t_s", "trained_steps", "gpu_j", "cpu_j", "actor_throttle_s")

    def __init__(self) -> None:
        self.rows: list[tuple[float, int, float, float, float]] = []
        self.started_unix = 0.0

    def start(self) -> None:
        self.rows.clear()
        self.started_unix = time.time()

    def sample(
        self,
        t_s: float,
        trained_steps: int,
        energy: Any,
        throttle: Any = None,
        force: bool = False,
    ) -> None:
        """Adds a row if ``TIMELINE_S`` passed since the last (or ``force``). ``energy`` and
        ``throttle`` are callables, read only when a row is added: the run's energy window so
        far, and the actors' waits on their in-flight budget so far, summed (None: 0)."""
        if self.rows and t_s - self.rows[-1][0] < TIMELINE_S and not force:
            return
        e, waited = energy(), throttle() if throttle is not None else 0.0
        self.rows.append((t_s, trained_steps, e.gpu_total_j, e.cpu_energy_j, waited))

    def to_doc(self) -> dict[str, Any]:
        return {
            "started_unix": self.started_unix,
            "columns": list(self.COLUMNS),
            "rows": [list(r) for r in self.rows],
        }


class RunRecord(Protocol):
    """What the result document reads of a run (``runtime.runner.Runner`` has it all)."""

    cfg: TrainConfig
    telemetry: RunTelemetry
    fleet: GMIFleet
    resume: checkpoint.Resume | None
    timeline: Timeline
    changes: list[dict[str, Any]]
    interrupted: bool
    supervisor: Supervisor
    cpu_0: float
    """The runner process's CPU seconds (``time.process_time``) when the run began."""

    @property
    def ended(self) -> Incarnations: ...

    @property
    def restarts(self) -> int: ...

    @property
    def phases(self) -> PhaseLog | None: ...

    def trainer_names(self) -> list[str]: ...


def lost_steps_by_incarnation(complete: dict[str, int], stepped: dict[str, int]) -> dict[str, int]:
    """Steps each actor incarnation took that never reached the compressor as whole rollouts."""
    return {key: n - int(complete.get(key, 0)) for key, n in stepped.items()}


def noise_doc(trainer: dict[str, Any], batch: int) -> dict[str, Any]:
    """The learner's gradient noise scale (``policies.noise_scale``) as the lead trainer last
    reported it: samples, the run's batch at the end, and that batch's statistical efficiency
    (all None before the first estimate). The batch is the config's, not the last update's: a
    drain trains what is in flight as a last, smaller update."""
    from policies.noise_scale import efficiency

    value = trainer.get("noise_scale")
    ok = isinstance(value, int | float) and batch > 0
    return {
        "samples": value if ok else None,
        "batch_samples": batch if ok else None,
        "efficiency": efficiency(value, batch) if ok else None,
    }


def failure_text(exc: BaseException) -> str:
    """What a failed run's result says went wrong: a ``RunError``'s own message (a service
    died, a drain did not complete), any other error with its type."""
    return str(exc) if isinstance(exc, RunError) else f"{type(exc).__name__}: {exc}"


def attach_failure(exc: BaseException, runner: Any, wall_s: float) -> None:
    """Gives an error that ended a run (not Ctrl-C, not an exit) its ``result``: what the run
    had done by then (``failed_result``). A fault building it is logged, never raised over the
    run's own error."""
    if not isinstance(exc, Exception):
        return
    try:
        exc.result = failed_result(runner, wall_s, failure_text(exc))  # type: ignore[attr-defined]
    except Exception:
        logger.exception("the failed run's result could not be built")


def failed_result(runner: Any, wall_s: float, error: str) -> dict[str, Any]:
    """The result of a run that failed (a service died, or an error in the run's own loop):
    what it had done by then. Its processes are gone, so everything sampled and not trained or
    discarded counts as lost."""
    tel = runner.telemetry
    trained, discarded = tel.learned_steps, tel.discarded_steps
    sampled = max(runner.actors.sampled_steps(), trained + discarded)
    return {
        "env": runner.cfg.env,
        "failed": True,
        "failure": error,
        "env_steps": trained,
        "sampled_steps": sampled,
        "discarded_steps": discarded,
        "lost_steps": sampled - trained - discarded,
        "rolled_back_steps": tel.rolled_back_steps,
        "wall_s": wall_s,
        "return_mean": tel.return_mean,
        "episodes": tel.episodes,
        "actor_restarts": runner.restarts,
        "service_replacements": runner.supervisor.replacements,
        "stalls": tel.stalls,
        "divergence": tel.divergence.found,
        "config": runner.cfg.to_dict(),
        "checkpoint": checkpoint.result_doc(runner.cfg, runner.resume),
    }


def gmi_doc(name: str, counters: dict[str, Any]) -> dict[str, Any]:
    """One trainer GMI as the result lists it (SMs as CUDA reported them inside the GMI); ``gpu``
    is its CUDA index in the run, ``nvml_gpu`` the same GPU as NVML and ``nvidia-smi`` number
    it, and as the energy's ``per_gpu_j`` keys it (they differ where the run's
    ``CUDA_VISIBLE_DEVICES`` names GPUs, as a daemon's GPU choice sets it; None where it names
    them by UUID)."""
    keys = (
        "rank",
        "generation",
        "device",
        "gpu",
        "mps_pct",
        "sm_count",
        "trained_steps",
        "resumed",
        "floor_version",
        "retired",
        "weights_digest",
        "startup",
        "compile_parts",
        "cpu_s",
    )
    doc = {"name": name, **{k: counters.get(k) for k in keys}}
    doc["nvml_gpu"] = known_nvml_index(doc["gpu"]) if isinstance(doc["gpu"], int) else None
    return doc


def inference_doc(runner: RunRecord) -> dict[str, Any]:
    """Where actions were computed: ``{"mode": "actor"}``, or the inference GMI's place and
    figures (requests, rows, batches, rows_per_batch, compute_s, SMs) and the actors' total
    time spent waiting for it (``actor_wait_s``)."""
    if runner.cfg.inference != "gmi":
        return {"mode": "actor"}
    tel = runner.telemetry
    counters = tel.source(INFERENCE)
    keys = (
        "device",
        "gpu",
        "mps_pct",
        "sm_count",
        "requests",
        "rows",
        "value_rows",
        "batches",
        "rows_per_batch",
        "max_batch_rows",
        "compute_s",
        "version",
    )
    waited = sum(float(tel.source(a).get("inference_wait_s", 0.0)) for a in tel.actor_sources())
    return {"mode": "gmi", **{k: counters.get(k) for k in keys}, "actor_wait_s": waited}


def minibatch_doc(cfg: TrainConfig) -> dict[str, int]:
    """The learner's split per epoch: as asked (``minibatches``), its floor (``min_samples``)
    and what a batch of the run's (last) batch size takes (``at_batch``)."""
    learner, batch = cfg.learner, cfg.batch_size
    return {
        "asked": learner.minibatches,
        "min_samples": learner.min_minibatch,
        "at_batch": learner.minibatches_for(batch, max(1, batch // cfg.rollout_len)),
    }


def build_result(runner: RunRecord, wall_s: float, energy: Any) -> dict[str, Any]:
    """Assembles the JSON-ready result from the runner's telemetry and energy window.

    Keys: env, env_steps (trained steps the learner holds: ``RunTelemetry.learned_steps``),
    sampled_steps, discarded_steps, lost_steps, rolled_back_steps (trained, then rolled back by
    a trainer restart: lost to the learner, so among lost_steps and not env_steps),
    service_replacements (``runtime.supervisor``: each service death the run survived; with
    any, lost_steps is what was sampled and neither trained into the learner nor discarded),
    wall_s, steps_per_s (env_steps per second), energy {gpu_j, cpu_j, gpu_source, cpu_source, ...},
    steps_per_joule (env_steps / (GPU + CPU joules)), and where the CPU figure is the model
    (``cpu_source`` ``model``) energy's cpu_model (its name, watts, idle watts and their
    source), cpu_idle_j and cpu_j_busy_only, and steps_per_joule_busy_only (the busy-only
    model's, without the packages' idle draw; absent for RAPL), return_mean (last 100 episodes),
    policy_lag {mean, max}, minibatches (``minibatch_doc``),
    actor_waits {throttle_s, dispatch_s}, actor_time {env_s, policy_s, cpu_s,
    cpu_us_per_step}, cpu_time (``cpu_time``: each kind of process's CPU seconds), config,
    stages {dispenser|compressor|migrator|batcher: {messages,
    bytes}}, gmis (one entry per trainer GMI of every generation: rank, gpu, mps_pct,
    sm_count, trained_steps, ...), gmi_sharing (mps|shared|exclusive|cpu), gmi_sync,
    weights_identical (the current GMIs ended with bit-identical weights), phases (one per
    GMI generation, with its own steps/s, GPU W, CPU W and steps per joule; the phases, the
    gmis and the timeline count every step trained, rolled back ones too), gmi_handovers
    (``runtime.gmi.fleet.GMIFleet.handovers``: how long each old generation trained on while
    its successor started), gmi_spares (GMIs started from a spare process:
    ``runtime.gmi.spares``), inference
    (``inference_doc``), timeline (every ``TIMELINE_S`` while serving: seconds since the
    start, cumulative trained steps, GPU J, CPU J and the actors' summed seconds waiting on
    their in-flight budget, as ``columns`` names them; ``started_unix`` dates it), checkpoint
    (``runtime.checkpoint.result_doc``, None without one), plus episodes, actor_restarts and
    malformed message counts (per service and trainer GMI, the actors summed, the runner's
    own), auth_refused (connections to a ``tcp://`` run's links refused for a key that is not
    the run's: ``runtime.curve``; 0 on ipc). Every count is this run's, also in a run resumed
    from a checkpoint; a resumed run's return window starts with the 100 returns its
    checkpoint kept.
    """
    tel = runner.telemetry
    compressor = tel.source("compressor")
    replaced = runner.supervisor.replacements
    runner.ended.settle(compressor.get("complete_steps", {}))
    lost_by_inc = lost_steps_by_incarnation(
        compressor.get("complete_steps", {}), runner.ended.stepped
    )
    for key, n in lost_by_inc.items():
        if n and key not in runner.ended.died and not replaced:
            logger.error(
                "actor %s exited cleanly but %d of its steps never arrived whole (the "
                "compressor evicted %d steps of incomplete rollouts in all)",
                key,
                n,
                compressor.get("evicted_steps", 0),
            )
    trained = tel.learned_steps
    lag_mean, lag_max = tel.policy_lag()
    energy_doc = (
        energy.to_dict()
        if energy is not None
        else {"gpu_j": 0.0, "cpu_j": 0.0, "gpu_source": "none", "cpu_source": "none"}
    )
    total_j = energy_doc["gpu_j"] + energy_doc["cpu_j"]
    if read_errors := getattr(getattr(runner, "meter", None), "read_errors", 0):
        energy_doc["read_errors"] = read_errors  # reads taken at their source's last reading
    if (cluster := getattr(runner, "cluster_energy", None)) is not None:
        energy_doc.update(cluster)  # a cluster run: its nodes, and the other hosts' joules
        total_j += cluster["other_hosts_j"]
    busy_only = {}  # not for a cluster run: its other hosts' meters say no idle part
    if energy_doc.get("cpu_j_busy_only") is not None and cluster is None:
        busy_only_j = energy_doc["gpu_j"] + energy_doc["cpu_j_busy_only"]
        busy_only["steps_per_joule_busy_only"] = trained / busy_only_j if busy_only_j > 0 else None
    current = runner.trainer_names()
    trainer = tel.source(current[0])
    services = [*PIPELINE, *([INFERENCE] if runner.cfg.inference == "gmi" else [])]
    malformed = {name: tel.total(name, "malformed") for name in (*services, *tel.trainer_sources())}
    malformed["actors"] = sum(int(tel.source(a).get("malformed", 0)) for a in tel.actor_sources())
    malformed["runner"] = tel.malformed.count
    digests = {tel.source(name).get("weights_digest") for name in current}
    return {
        "env": runner.cfg.env,
        "env_steps": trained,
        "sampled_steps": sum(runner.ended.stepped.values()),
        "discarded_steps": tel.discarded_steps,
        "lost_steps": (
            sum(runner.ended.stepped.values()) - trained - tel.discarded_steps
            if replaced  # the old services' counts died with them; the drain left nothing
            else sum(lost_by_inc.values())
        ),
        "rolled_back_steps": tel.rolled_back_steps,
        "service_replacements": replaced,
        "wall_s": wall_s,
        "steps_per_s": trained / wall_s if wall_s > 0 else 0.0,
        "energy": energy_doc,
        "steps_per_joule": trained / total_j if total_j > 0 else None,
        **busy_only,
        "return_mean": tel.return_mean,
        "episodes": tel.episodes,
        "policy_lag": {"mean": lag_mean, "max": lag_max},
        "actor_waits": actor_waits(tel),
        "cpu_time": cpu_time(runner, wall_s),
        "actor_time": actor_time(tel, sum(runner.ended.stepped.values())),
        "actor_restarts": runner.restarts,
        "interrupted": runner.interrupted,
        "failure": (tel.fatal() or runner.failure) if runner.failure else None,
        "stalls": tel.stalls,
        "divergence": tel.divergence.found,
        "trainer_device": trainer.get("device"),
        "updates": trainer.get("version", 0) - _resumed_version(runner),  # this run's
        "learner_version": trainer.get("version", 0),  # from the checkpoint's on
        "noise_scale": noise_doc(trainer, runner.cfg.batch_size),
        "learning_rate": {
            "schedule": runner.cfg.learner.lr_schedule,
            "kl_target": runner.cfg.learner.kl_target,
            "scaling": runner.cfg.learner.lr_scaling,
            "for_batch": runner.cfg.learner.lr_batch,
            "last": trainer.get("lr"),
            "last_kl": trainer.get("kl"),
        },
        "minibatches": minibatch_doc(runner.cfg),
        "target": runner.target.doc((trained, wall_s, total_j))
        if hasattr(runner, "target")
        else None,
        "gmis": [gmi_doc(name, tel.source(name)) for name in tel.trainer_sources()],
        "gmi_sharing": runner.fleet.sharing,
        "gmi_sync": trainer.get("sync", "none"),
        "mps_note": runner.fleet.mps_note,
        "weights_identical": len(digests) == 1 and None not in digests,
        "phases": runner.phases.to_list() if runner.phases else [],
        "gmi_handovers": list(runner.fleet.handovers),
        "gmi_spares": runner.fleet.spares.taken if runner.fleet.spares is not None else 0,
        "inference": inference_doc(runner),
        "changes": runner.changes,
        "checkpoint": checkpoint.result_doc(runner.cfg, runner.resume),
        "timeline": runner.timeline.to_doc(),
        "malformed": malformed,
        "auth_refused": sum(int(tel.total(name, "auth_refused")) for name in services)
        + runner.guard.refused,
        "config": runner.cfg.to_dict(),
        "stages": tel.stages(),
    }


def timeline_rate(result: dict[str, Any], t0: float, t1: float) -> dict[str, float] | None:
    """Trained steps/s, steps/J, GPU W and CPU W between ``t0`` and ``t1`` seconds of a result's
    timeline (the first and last samples inside the span), and the actors' summed seconds of
    waiting on their in-flight budget in it (``actor_throttle_s``, where the timeline has the
    column); None if fewer than two samples fall in it."""
    rows = [r for r in result["timeline"]["rows"] if t0 <= r[0] <= t1]
    if len(rows) < 2 or rows[-1][0] <= rows[0][0]:
        return None
    (ta, sa, ga, ca), (tb, sb, gb, cb) = rows[0][:4], rows[-1][:4]
    joules = (gb - ga) + (cb - ca)
    out = {
        "from_s": ta,
        "to_s": tb,
        "steps_per_s": (sb - sa) / (tb - ta),
        "steps_per_joule": (sb - sa) / joules if joules > 0 else None,
        "gpu_w": (gb - ga) / (tb - ta),
        "cpu_w": (cb - ca) / (tb - ta),
    }
    if len(rows[0]) > 4 and len(rows[-1]) > 4:  # timelines before the column lack it
        out["actor_throttle_s"] = rows[-1][4] - rows[0][4]
    return out


def _resumed_version(runner: Any) -> int:
    """The learner version a run resumed from a checkpoint started at (0 for a fresh run)."""
    return runner.resume.version if runner.resume is not None else 0
