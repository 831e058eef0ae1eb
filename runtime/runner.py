"""Launches one training run as processes, watches it, restarts dead actors, and drains it.

    runner (this process) ── spawns ──▶ compressor, migrator, trainer GMIs, actors, an inference GMI

Trainer GMIs are placed by ``runtime.gmi.placement`` (``trainers`` per GPU, MPS percentages);
where MPS is wanted the runner reuses or starts an MPS daemon (``runtime.hw.mps``) and stops it at
the end if it started it. A percentage change replaces every GMI by a new generation (an MPS
client's percentage is fixed for its life): the old ones train until the new ones report, then
hand their learner state over (``runtime.gmi.fleet``). Each period between changes is a phase with
its own energy window (``Generations``); a failed run checkpoints its GMIs' furthest state.

``reconfigure`` changes settings of the running job (``runtime.live``): actors are added or
removed (a removed actor delivers what it collected first), respawned with another env count,
the compressor and trainers take chunk and batch sizes from a COMMAND ``live`` (signed and
numbered: ``runtime.commands``), and GMI settings start a new generation (the same hand-over).

Lifecycle:
  1. start the services, then the actors; open an energy window.
  2. every ``TICK_S``: read telemetry, restart any actor that died (its in-flight steps are
     counted as lost), stop when the trained-step target or the wall limit is reached, or on
     Ctrl-C. A dead compressor, migrator, trainer or inference GMI is replaced (supervisor).
  3. drain (``runtime.drain``): actors deliver their last rollouts, every stage passes all and
     an EOS on, the trainers train what is left and report; then the services exit.

Accounting: ``sampled_steps`` counts every env step every actor incarnation took (a shared
counter). An incarnation's steps that never reached the compressor whole are ``lost_steps``.
Everything the compressor received whole is trained (``env_steps``) or discarded as too stale
(``discarded_steps``), so ``sampled_steps == env_steps + discarded_steps + lost_steps``
after a clean finish.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import multiprocessing as mp
import signal
import time
from collections.abc import Callable
from typing import Any

import zmq

from runtime import checkpoint, cluster, live, run_dirs, topology, wire
from runtime.actor_pool import ActorPool, Incarnations
from runtime.commands import CommandOut
from runtime.config import ConfigError, TrainConfig
from runtime.curve import Guard, NoGuard
from runtime.drain import Drain, TrainedRate, wall_due
from runtime.energy.shares import job_meter, shares_doc
from runtime.envs import EnvInfo
from runtime.generations import Generations, MPSChange
from runtime.gmi.fleet import GMIFleet
from runtime.gmi.spares import Spares
from runtime.inference import inference_main
from runtime.phases import PhaseLog
from runtime.results import Timeline, attach_failure, build_result
from runtime.run_state import RUN_WINDOW, RunState
from runtime.services import RunError, Services
from runtime.supervisor import Supervisor
from runtime.target import RunTotals, TargetReturn
from runtime.telemetry import RunTelemetry
from runtime.time_spent import actor_waits

__all__ = ["RUN_WINDOW", "RunError", "RunState", "Runner"]

logger = logging.getLogger(__name__)

TICK_S = 0.1
"""The main loop's tick: how long each pass reads telemetry (and each drain wait)."""


class Runner:
    """Runs one training job to completion (see the module docstring).

    Args:
        cfg: The validated configuration.
        info: The environment description from ``cfg.validate()``.
        on_progress: Called with a ``RunState`` every tick (the CLI's live display).
        meter: Energy meter (``runtime.energy.EnergyMeter``); None: the default, whose CPU
            model (no RAPL) charges ``cfg.cpu_idle_w`` of idle power.
        mps_changes: Planned GMI replacements (``runtime.generations.MPSChange``), any order.
        mps_live: Start MPS (where GMIs are on a GPU) even if nothing needs it yet, so that
            ``reconfigure`` can set percentages later (a tuner does).
        spares: Spare GMI processes started before the run (``spares.started_ahead``): its
            first GMIs start from them where they are ready. None: the run's own.

    Raises:
        ConfigError: ``cfg.checkpoint`` holds a state this run cannot resume (``checkpoint.check``).
        ValueError: a percentage in ``mps_changes`` does not fit the GMIs.
    """

    def __init__(
        self,
        cfg: TrainConfig,
        info: EnvInfo,
        on_progress: Callable[[RunState], None] | None = None,
        meter: Any = None,
        mps_changes: list[MPSChange] | None = None,
        mps_live: bool = False,
        spares: Spares | None = None,
    ) -> None:
        cfg = cfg.as_run()  # the backend actors use, the batch the learning rate is for
        self.cfg, self.info = cfg, info
        self.resume = checkpoint.check(cfg, info)  # the checkpoint it starts from, or None
        self.resumed_steps = self.resume.trained_steps if self.resume is not None else 0
        """Trained steps of the runs before this one, counted toward ``cfg.steps``."""
        self.mps_live = mps_live
        self._pending_cfg: TrainConfig | None = None
        self.live = live.LiveBroadcaster()
        self.changes: list[dict[str, Any]] = []
        """Every live change applied: ``{"t": seconds into the run, "changed": {name: value}}``."""
        self._started, self.cpu_0 = time.monotonic(), time.process_time()
        self.wall_from: float | None = None  # when max_wall_s counts from (None: the run's start)
        self.pace = TrainedRate()  # the trained rate the wall limit's drain reserve goes by
        self.mp = ctx = mp.get_context("spawn")
        self.services = Services(ctx)
        spares = spares or Spares(ctx, self.services.adopt)
        spares.adopt = self.services.adopt  # one started ahead is this run's now
        self.fleet = GMIFleet(cfg, info, self.services.spawn, spares)
        self.fleet.floor_version = self.resume.version if self.resume is not None else 0
        self.generations = Generations(self.fleet, mps_changes)
        self.on_progress, self.meter = on_progress, meter
        self.timeline = Timeline()
        self.telemetry = RunTelemetry(act_dim=None if info.discrete else info.act_dim)
        self.resumed_episodes = 0  # of the runs before (the return window goes on from theirs)
        if self.resume is not None:
            saved = checkpoint.load_returns(str(cfg.checkpoint), self.resume.trained_steps)
            self.telemetry.returns.extend(saved[0])
            self.resumed_episodes = saved[1]
        self.actors = ActorPool(self.mp, info)
        chunks = lambda: (self.cfg.chunk_bytes, self.cfg.chunk_timeout_s)  # noqa: E731
        self.supervisor = Supervisor(
            self.services, self.actors, self.telemetry, self.generations, chunks, self.resume
        )
        self.inference_place: Any = None  # where the inference GMI runs, else None
        self.stop_requested = self.interrupted = False
        self.failure: str | None = None
        """Why the run stopped early (an actor slot given up, a non-finite value), or None."""
        self.cluster_energy: dict[str, Any] | None = None  # a cluster run's nodes
        self.target = TargetReturn(cfg.target_return, RunTotals.of(cfg, self.resume))
        self.guard: Guard | NoGuard = NoGuard()

    # --- live changes -------------------------------------------------------------------------

    def reconfigure(self, **changes: Any) -> live.Plan:
        """Asks for live changes of settings, applied at the next tick (``runtime.live``); safe
        from ``on_progress`` or another thread, merged with changes not yet applied.

        Returns:
            What the change takes (actors added or removed, actors respawned, a live message
            to the services, a GMI hand-over).

        Raises:
            ConfigError: for an unknown setting, an invalid value, a setting that needs a new
                run, or GMIs that need MPS in a run without it; nothing changes then.
        """
        base = self._pending_cfg or self.cfg
        unknown = sorted(set(changes) - {f.name for f in dataclasses.fields(TrainConfig)})
        if unknown:
            raise ConfigError(
                [f"unknown setting(s) {unknown}; live settings: {', '.join(live.LIVE_FIELDS)}"]
            )
        new = dataclasses.replace(base, **changes)
        new.validate()
        plan = live.plan(self.cfg, new, self.info)
        if plan.handover:
            try:
                self.generations.check(new)
            except ValueError as exc:
                raise ConfigError([str(exc)]) from None
        self._pending_cfg = new
        return plan

    def _apply(self, ep: topology.Endpoints, command_sock: CommandOut, new: TrainConfig) -> None:
        plan = live.plan(self.cfg, new)
        if plan.empty:
            return
        self.cfg = new
        if plan.respawn_actors:
            self.actors.respawn(new, ep)
        if plan.actors:
            self.actors.resize(new, ep)
        if plan.services:
            self.live.bump(command_sock, new)
        if plan.handover:
            self.generations.replace(self.telemetry.trained_steps, cfg=new)
        changed = {name: getattr(new, name) for name in plan.changed}
        self.changes.append({"t": time.monotonic() - self._started, "changed": changed})
        logger.info("live change: %s", changed)

    def settled(self) -> bool:
        """Whether every change asked for has taken effect: none pending, no removed actor
        still delivering, every actor stepping, every current GMI holding the learner state."""
        if self._pending_cfg is not None or self.actors.leaving:
            return False
        if any(slot.stepped.value == 0 for slot in self.actors.slots):
            return False  # a new actor is still starting
        gmis = [self.telemetry.source(name) for name in self.trainer_names()]
        return bool(gmis) and all(g.get("holds_state") for g in gmis)

    def _start_services(self, ep: topology.Endpoints) -> None:
        self.supervisor.start(ep, self.run_dir)  # the compressor and the migrator
        if self.cfg.inference == "gmi":  # the supervisor starts it again should it die
            self.inference_place = place = self.fleet.inference_place()
            self.supervisor.start_inference((inference_main, (self.cfg, self.info, ep, place)))
        state = self.resume.state_file if self.resume is not None else None
        self.fleet.start(ep, self.run_dir, state)

    def cluster_nodes(self) -> list[dict[str, Any]] | None:
        """A cluster run's nodes now (``RemoteLauncher.nodes_now``); None for a local run."""
        launcher = self.actors.launcher
        return launcher.nodes_now() if launcher is not None else None

    @property
    def generation(self) -> int:  # of the trainer GMIs: 0 until the first hand-over
        return self.fleet.generation

    def trainer_names(self) -> list[str]:
        """Telemetry names of the current generation's GMIs."""
        return self.fleet.names()

    def request_replace(self, mps_pct: tuple[int, ...] | None = None) -> None:
        """Asks for a GMI hand-over at the next tick (from ``on_progress`` or a tuner), with
        percentages ``mps_pct`` (None: the same).

        Raises:
            ValueError: if ``mps_pct`` does not fit the GMIs (checked now, not mid-run).
        """
        self.generations.request(mps_pct)

    @property
    def phases(self) -> PhaseLog | None:  # one per GMI generation; None before the start
        return self.generations.phases

    @property
    def slots(self) -> list[Any]:  # the running actors (runtime.actor_pool.ActorSlot)
        return self.actors.slots

    @property
    def ended(self) -> Incarnations:
        return self.actors.ended

    @property
    def restarts(self) -> int:
        return self.actors.restarts

    def _check_processes(self, ep: topology.Endpoints, command_sock: CommandOut) -> None:
        self.supervisor.check(ep, command_sock)
        self.actors.check(ep)
        self.telemetry.watch([n for n, p in self.services.items() if p.is_alive()])

    def _read_telemetry(self, sock: zmq.Socket, timeout_ms: int) -> None:
        if not sock.poll(timeout_ms):
            return
        for msg in wire.recv_waiting(sock, self.telemetry.malformed):
            try:
                self.telemetry.handle(msg)
            except wire.ProtocolError as exc:
                self.telemetry.malformed.drop(exc)

    def state(self, started: float, draining: bool = False) -> RunState:
        return RunState.of(self.telemetry, self.actors, time.monotonic() - started, draining)

    # --- the run ---------------------------------------------------------------------------

    def _on_signal(self, signum: int, frame: Any) -> None:
        """Ctrl-C or SIGTERM (a scheduler's stop): drain, save and report as at the end; the
        second abandons the run (its children are killed on the way out)."""
        name = "Ctrl-C" if signum == signal.SIGINT else signal.Signals(signum).name
        if self.stop_requested:  # give up on the drain
            raise KeyboardInterrupt if signum == signal.SIGINT else SystemExit(128 + signum)
        logger.warning("%s: draining in-flight experience (%s again to abort)", name, name)
        self.stop_requested = self.interrupted = True

    def run(self) -> dict[str, Any]:
        """Runs the job; returns the result document (see ``runtime.results``)."""
        if self.meter is None:  # a job that shares the machine is charged its share of it
            self.meter = job_meter(self.cfg.cpu_idle_w)
        meter = self.meter
        # what is made before the run's loop is undone however the start ends, last made first
        with run_dirs.run_dir() as run_dir, contextlib.ExitStack() as undo:
            ctx = zmq.Context()
            undo.callback(ctx.destroy, linger=0)
            self.run_dir = self.actors.initial.directory = run_dir
            ep = self.endpoints = topology.Endpoints.of(self.cfg, run_dir)
            undo.callback(ep.release)  # the tcp:// links' ports
            self.guard = topology.guard(ctx, ep)
            undo.callback(self.guard.stop)  # before the context ends
            telemetry_sock, command_sock = topology.runner_sockets(ctx, ep)
            self.telemetry.key = ep.run_key  # reports must be the run's processes' own
            undo.callback(topology.WeightsForwarder(ctx, ep).start().stop)
            undo.callback(self.fleet.stop)  # its spares, and an MPS daemon the run started
            self.fleet.setup_sharing(self.mps_live or self.generations.mps_later)
            meter.begin_window(RUN_WINDOW)
            started = self._started = time.monotonic()
            self.timeline.start()
            self.generations.begin(ep, run_dir, command_sock, meter, started)
            previous = signal.signal(signal.SIGINT, self._on_signal)
            previous_term = signal.signal(signal.SIGTERM, self._on_signal)
            try:
                if self.cfg.cluster is not None:  # actors on a Ray cluster's nodes
                    self.actors.launcher = cluster.launch(self.cfg, self.telemetry)
                self._start_services(ep)
                self.actors.start(self.cfg, ep)
                self._serve(ep, telemetry_sock, command_sock, started)
                self._sample_timeline(started, force=True)
                self._drain(telemetry_sock, command_sock, started)
                if self.cfg.checkpoint is not None:
                    episodes = self.resumed_episodes + self.telemetry.episodes
                    totals = self.target.before.through(time.monotonic() - started, self._joules())
                    returns = list(self.telemetry.returns)
                    checkpoint.save_returns(self.cfg.checkpoint, returns, episodes, totals)
            except BaseException as exc:
                self._kill_all()  # its GMIs' last saves kept, not lost with the run directory
                checkpoint.keep_furthest(self.cfg, self.info, self.fleet.kept(run_dir, None))
                attach_failure(exc, self, time.monotonic() - started)  # what it had done
                raise
            finally:
                signal.signal(signal.SIGINT, previous)
                signal.signal(signal.SIGTERM, previous_term)
                wall_s = time.monotonic() - started
                self.generations.end(self.telemetry.trained_steps)
                try:
                    energy = meter.end_window(RUN_WINDOW)
                except ValueError:
                    energy = None
                self.cluster_energy = self.actors.close_launcher()
        result = build_result(self, wall_s, energy)
        result["energy"]["shares"] = shares_doc(self.meter)
        return result

    def _serve(
        self,
        ep: topology.Endpoints,
        telemetry_sock: zmq.Socket,
        command_sock: CommandOut,
        started: float,
    ) -> None:
        # after Ctrl-C too, a replacement under way finishes first: the drain needs it
        while not self.stop_requested or self.supervisor.busy:
            self._read_telemetry(telemetry_sock, int(TICK_S * 1000))
            self._check_processes(ep, command_sock)
            if (why := self.telemetry.fatal() or self.actors.gave_up) is not None:
                self.failure = why
                logger.error("stopping the run: %s", why)
                break
            tel = self.telemetry  # a GMI generation retires once the next one reports
            self.fleet.send_retire(command_sock, tel.source("migrator"), tel.seen.__contains__)
            if self._pending_cfg is not None:
                self._apply(ep, command_sock, self._pending_cfg)
                self._pending_cfg = None
            self.live.send(command_sock, self.cfg)
            self.generations.replace_due(time.monotonic() - started, self.telemetry.trained_steps)
            if self.on_progress is not None:
                self.on_progress(self.state(started))
            self._sample_timeline(started)
            if self.supervisor.busy:
                continue  # the drain needs the replaced pipeline up and acknowledged
            if self.target.check(tel, time.monotonic() - started, self._joules):
                logger.info("draining: the target return %s is reached", self.cfg.target_return)
                break
            if self.resumed_steps + self.telemetry.learned_steps >= self.cfg.steps:
                break
            rate = self.pace.observe(tel.trained_steps, started)
            if wall_due(self.cfg, self.wall_from or started, rate):
                logger.info("draining to end by the wall limit of %.0f s", self.cfg.max_wall_s)
                break

    def _joules(self) -> float:
        return self.meter.peek_window(RUN_WINDOW).total_j

    def joules_so_far(self) -> float:  # with the runs' before it where a checkpoint saved theirs
        return self.target.before.joules + self._joules()

    def _sample_timeline(self, started: float, force: bool = False) -> None:
        self.timeline.sample(
            time.monotonic() - started,
            self.telemetry.trained_steps,
            lambda: self.meter.peek_window(RUN_WINDOW),
            lambda: actor_waits(self.telemetry)["throttle_s"],
            force,
        )

    def _drain(self, telemetry_sock: zmq.Socket, command_sock: CommandOut, started: float) -> None:
        def report() -> None:
            if self.on_progress is not None:
                self.on_progress(self.state(started, draining=True))

        parts = (self.actors, self.services, self.fleet, self.telemetry, self._read_telemetry)
        Drain(*parts, report, TICK_S, self.pace.longest_gap_s).run(telemetry_sock, command_sock)
        self._sample_timeline(started, force=True)  # the timeline covers the drain too

    def _kill_all(self) -> None:
        self.actors.kill_all()
        self.services.kill_all()
        self.fleet.let_spares_go()
