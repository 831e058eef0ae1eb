"""Launches one training run as processes, watches it, restarts dead actors, and drains it.

    runner (this process) ── spawns ──▶ compressor, migrator, trainer GMIs, actor-0..A-1

Trainer GMIs are placed by ``runtime.gmi.placement`` (``trainers`` per GPU, MPS percentages);
where MPS is wanted the runner reuses or starts an MPS daemon (``autotune.hw.mps``) and stops
it at the end if it started it. A percentage change replaces every GMI by a new generation
with other percentages (an MPS client's percentage is fixed for its life): ``replace_gmis``
starts the new GMIs, which take
chunks at once, the old ones get RETIRE from the migrator, train what they hold and hand the
learner state over. Each period between changes is a phase with its own energy window.

Lifecycle:
  1. start the services, then the actors; open an energy window.
  2. every ``TICK_S``: read telemetry, restart any actor that died (its in-flight steps are
     counted as lost), stop when the trained-step target or the wall limit is reached, or on
     Ctrl-C. A service (compressor, migrator, trainer) that dies ends the run with an error.
  3. drain: actors finish their current rollout, send it and an EOS, and exit once the trainer
     confirmed receipt; the compressor is told how many steps each actor incarnation that
     exited cleanly sent, waits for them (or their EOS), flushes and passes EOS on; the
     migrator forwards everything and passes EOS on; the trainer trains what is left and
     reports. Only then are the services told to exit (closing a socket earlier could drop
     its queued tail).

Accounting: ``sampled_steps`` counts every env step every actor incarnation took (a shared
counter each actor bumps per step). An incarnation's steps that never reached the compressor
whole are ``lost_steps`` (only actors that died have any). Everything the compressor received
whole is trained (``env_steps``) or discarded as too stale (``discarded_steps``), so
``sampled_steps == env_steps + discarded_steps + lost_steps`` after a clean finish.
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import signal
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import zmq

from runtime import topology, wire
from runtime.actor import actor_main
from runtime.config import TrainConfig
from runtime.envs import EnvInfo
from runtime.gmi import placement
from runtime.gmi.placement import GMISpec
from runtime.stages.compressor import compressor_main
from runtime.stages.migrator import migrator_main
from runtime.telemetry import RunTelemetry
from runtime.trainer import GMIRole, trainer_main

logger = logging.getLogger(__name__)

TICK_S = 0.1
ACTOR_EXIT_TIMEOUT_S = 60.0
"""How long the drain waits for actors to finish their rollout and exit."""
SERVICE_DRAIN_TIMEOUT_S = 120.0
"""How long the drain waits for each service's final report."""
DRAIN_RESEND_S = 0.5
SERVICE_EXIT_TIMEOUT_S = 30.0


def _raise_system_exit(signum: int, frame: Any) -> None:
    """SIGTERM: abandon the run; ``Runner.run`` kills its children on the way out."""
    raise SystemExit(128 + signum)


class RunError(RuntimeError):
    """A service process died or a drain did not complete."""


@dataclass
class _ActorSlot:
    index: int
    incarnation: int
    process: Any
    stepped: Any


@dataclass
class RunState:
    """Live figures handed to the progress callback every tick."""

    elapsed_s: float
    trained_steps: int
    sampled_steps: int
    return_mean: float | None
    episodes: int
    policy_lag_mean: float
    policy_lag_max: int
    actor_restarts: int
    draining: bool


@dataclass
class Phase:
    """A stretch of the run with one set of GMIs, and what it trained per joule."""

    generation: int
    mps_pct: list[int | None]
    start_s: float
    trained_at_start: int
    end_s: float | None = None
    trained_steps: int = 0
    energy: Any = None

    def to_dict(self) -> dict[str, Any]:
        doc: dict[str, Any] = {"generation": self.generation, "mps_pct": self.mps_pct,
                               "start_s": self.start_s, "end_s": self.end_s,
                               "trained_steps": self.trained_steps}  # fmt: skip
        if self.energy is not None and self.end_s is not None:
            e = self.energy.to_dict()
            total = e["gpu_j"] + e["cpu_j"]
            span = self.end_s - self.start_s
            doc.update(gpu_w=e["gpu_j"] / span if span > 0 else 0.0,
                       cpu_w=e["cpu_j"] / span if span > 0 else 0.0,
                       steps_per_s=self.trained_steps / span if span > 0 else 0.0,
                       steps_per_joule=self.trained_steps / total if total > 0 else None,
                       energy=e)  # fmt: skip
        return doc


@dataclass
class _Incarnations:
    """Final step counters of every actor incarnation that has ended, by ``"actor:inc"``."""

    stepped: dict[str, int] = field(default_factory=dict)
    died: set[str] = field(default_factory=set)


class Runner:
    """Runs one training job to completion (see the module docstring).

    Args:
        cfg: The validated configuration.
        info: The environment description from ``cfg.validate()``.
        on_progress: Called with a ``RunState`` every tick (the CLI's live display).
        meter: Energy meter (``autotune.energy.EnergyMeter``); a default one when None.
        mps_changes: ``(seconds into the run, percentages or None)`` at which to replace the
            GMIs (see ``replace_gmis``; None keeps the percentages), in any order.
    """

    def __init__(self, cfg: TrainConfig, info: EnvInfo,
                 on_progress: Callable[[RunState], None] | None = None,
                 meter: Any = None,
                 mps_changes: list[tuple[float, tuple[int, ...] | None]] | None = None,
                 ) -> None:  # fmt: skip
        self.cfg, self.info = cfg, info
        self.gmis: list[GMISpec] = placement.place(cfg)
        self.generation = 0
        self.sharing = "cpu"
        self.mps: Any = None
        self.mps_note: str | None = None
        self.phases: list[Phase] = []
        self.mps_changes = sorted(mps_changes or [], key=lambda change: change[0])
        for _, pct in self.mps_changes:
            placement.place(cfg, pct)  # raises ValueError now rather than mid-run
        self.wants_mps_later = any(pct is not None for _, pct in self.mps_changes)
        self._requested: list[tuple[int, ...] | None] = []
        self._retiring: dict[int, int] = {}
        """Generations being retired (-> trainers of the next) until the migrator confirms."""
        self._retire_sent = 0.0
        self.on_progress = on_progress
        self.meter = meter
        self.mp = mp.get_context("spawn")
        self.telemetry = RunTelemetry()
        self.ended = _Incarnations()
        self.slots: list[_ActorSlot] = []
        self.services: dict[str, Any] = {}
        self.restarts = 0
        self.stop_requested = False
        self.interrupted = False

    # --- processes -------------------------------------------------------------------------

    def _start_services(self, ep: topology.Endpoints) -> None:
        cfg = self.cfg
        specs = {
            "compressor": (compressor_main, (ep, cfg.chunk_bytes, cfg.chunk_timeout_s)),
            "migrator": (migrator_main, (ep, len(self.gmis))),
        }
        for name, (target, args) in specs.items():
            self._spawn(name, target, args)
        self._start_gmis(ep, None)

    def _spawn(self, name: str, target: Callable[..., None], args: tuple[Any, ...]) -> None:
        proc = self.mp.Process(target=target, args=args, name=name, daemon=True)
        proc.start()
        self.services[name] = proc

    def _setup_sharing(self) -> None:
        """Decides how GMIs share their GPUs; starts or reuses MPS where it is wanted."""
        if all(s.gpu is None for s in self.gmis):
            self.sharing = "cpu"
            return
        if not (placement.wants_mps(self.gmis) or self.wants_mps_later):
            self.sharing = "exclusive"
            return
        from autotune.hw.mps import MPSControl, MPSUnavailable

        try:
            self.mps = MPSControl()
            self.mps.start()
            self.sharing = "mps"
        except MPSUnavailable as exc:
            self.mps = None
            self.sharing = "shared"
            self.mps_note = str(exc)
            logger.warning("MPS unavailable (%s): trainer GMIs run as plain shared processes "
                           "and no SM percentage applies", exc)  # fmt: skip

    def _gmi_env(self, spec: GMISpec) -> dict[str, str]:
        if self.mps is None or spec.gpu is None:
            return {}
        return self.mps.client_env(spec.mps_pct)

    def _start_gmis(self, ep: topology.Endpoints, resume_from: str | None) -> None:
        layout = placement.layout(self.gmis)
        for spec in self.gmis:
            role = GMIRole(spec, self.generation, layout, self.run_dir, resume_from,
                           self._gmi_env(spec))  # fmt: skip
            self._spawn(role.name, trainer_main, (self.cfg, self.info, ep, role))

    def trainer_names(self) -> list[str]:
        """Telemetry names of the current generation's GMIs."""
        return [topology.trainer_name(s.rank, self.generation) for s in self.gmis]

    def request_replace(self, mps_pct: tuple[int, ...] | None = None) -> None:
        """Asks for a GMI hand-over at the next tick (from ``on_progress`` or a tuner).

        Raises:
            ValueError: if ``mps_pct`` does not fit the GMIs (checked now, not mid-run).
        """
        if mps_pct is not None:
            placement.place(self.cfg, mps_pct)
        self._requested.append(mps_pct)

    def replace_gmis(self, ep: topology.Endpoints, control_sock: zmq.Socket,
                     mps_pct: tuple[int, ...] | None, started: float) -> None:  # fmt: skip
        """Replaces every GMI by a new generation, with percentages ``mps_pct`` (None: same).

        Experience keeps flowing to the new GMIs at once; the old ones retire, train what they
        hold and hand the learner state over (``runtime.trainer``). Nothing is dropped.
        """
        old = self.generation
        resume_from = GMIRole(self.gmis[0], old, [], self.run_dir).state_file()
        if mps_pct is not None:
            self.gmis = placement.place(self.cfg, mps_pct)
        self.generation = old + 1
        self._next_phase(started)
        logger.info("GMI hand-over: generation %d -> %d, MPS %s", old, self.generation,
                    [s.mps_pct for s in self.gmis])  # fmt: skip
        self._start_gmis(ep, resume_from)
        self._retiring[old] = len(self.gmis)
        self._send_retire(control_sock, force=True)

    def _send_retire(self, control_sock: zmq.Socket, force: bool = False) -> None:
        """(Re)sends ``retire`` until the migrator reports it (PUB/SUB may drop a message
        sent before a subscriber has joined)."""
        done = self.telemetry.source("migrator").get("retired_generations")
        for gen in [g for g in self._retiring if isinstance(done, list) and g in done]:
            del self._retiring[gen]
        now = time.monotonic()
        if not self._retiring or (not force and now - self._retire_sent < DRAIN_RESEND_S):
            return
        for gen, next_trainers in self._retiring.items():
            wire.send_msg(
                control_sock,
                wire.MsgType.CONTROL,
                {"cmd": "retire", "generation": gen, "next_trainers": next_trainers},
            )
        self._retire_sent = now

    def _next_phase(self, started: float) -> None:
        now = time.monotonic() - started
        if self.phases:
            phase = self.phases[-1]
            phase.end_s = now
            phase.trained_steps = self.telemetry.trained_steps - phase.trained_at_start
            phase.energy = self._meter.end_window(f"phase-{phase.generation}")
        self._meter.begin_window(f"phase-{self.generation}")
        self.phases.append(Phase(self.generation, [s.mps_pct for s in self.gmis], now,
                                 self.telemetry.trained_steps))  # fmt: skip

    def _start_actor(self, ep: topology.Endpoints, index: int, incarnation: int) -> _ActorSlot:
        stepped = self.mp.RawValue("q", 0)
        proc = self.mp.Process(
            target=actor_main, name=f"actor-{index}.{incarnation}", daemon=True,
            args=(self.cfg, self.info, ep, index, incarnation, stepped, self._stop_event),
        )  # fmt: skip
        proc.start()
        return _ActorSlot(index, incarnation, proc, stepped)

    def _end_actor(self, slot: _ActorSlot, died: bool) -> None:
        key = f"{slot.index}:{slot.incarnation}"
        self.ended.stepped[key] = int(slot.stepped.value)
        if died:
            self.ended.died.add(key)

    def _check_services(self) -> None:
        for name, proc in self.services.items():
            if not proc.is_alive() and not self.telemetry.is_final(name):
                raise RunError(f"{name} process died (exit code {proc.exitcode})")

    def _check_processes(self, ep: topology.Endpoints) -> None:
        self._check_services()
        for i, slot in enumerate(self.slots):
            if slot.process.is_alive():
                continue
            self._end_actor(slot, died=True)
            logger.warning(
                "actor %d.%d died (exit code %s) after %d steps; restarting",
                slot.index, slot.incarnation, slot.process.exitcode, slot.stepped.value,
            )  # fmt: skip
            self.restarts += 1
            self.slots[i] = self._start_actor(ep, slot.index, slot.incarnation + 1)

    # --- telemetry --------------------------------------------------------------------------

    def _read_telemetry(self, sock: zmq.Socket, timeout_ms: int) -> None:
        if not sock.poll(timeout_ms):
            return
        for msg in wire.recv_waiting(sock, self.telemetry.malformed):
            try:
                self.telemetry.handle(msg)
            except wire.ProtocolError as exc:
                self.telemetry.malformed.drop(exc)

    def _sampled_steps(self) -> int:
        return sum(self.ended.stepped.values()) + sum(int(s.stepped.value) for s in self.slots)

    def state(self, started: float, draining: bool = False) -> RunState:
        lag_mean, lag_max = self.telemetry.policy_lag()
        return RunState(
            time.monotonic() - started, self.telemetry.trained_steps, self._sampled_steps(),
            self.telemetry.return_mean, self.telemetry.episodes, lag_mean, lag_max,
            self.restarts, draining,
        )  # fmt: skip

    # --- the run ---------------------------------------------------------------------------

    def _on_sigint(self, signum: int, frame: Any) -> None:
        if self.stop_requested:
            raise KeyboardInterrupt  # second Ctrl-C: give up on the drain
        logger.warning("Ctrl-C: draining in-flight experience (Ctrl-C again to abort)")
        self.stop_requested = self.interrupted = True

    def run(self) -> dict[str, Any]:
        """Runs the job; returns the result document (see ``runtime.results``)."""
        from autotune.energy import EnergyMeter
        from runtime.results import build_result

        meter = self._meter = self.meter if self.meter is not None else EnergyMeter()
        self._stop_event = self.mp.Event()
        ctx = zmq.Context()
        with tempfile.TemporaryDirectory(prefix="autotune-") as run_dir:
            self.run_dir = run_dir
            ep = (topology.Endpoints.ipc(run_dir) if self.cfg.transport == "ipc"
                  else topology.Endpoints.tcp())  # fmt: skip
            telemetry_sock, control_sock = topology.runner_sockets(ctx, ep)
            forwarder = topology.WeightsForwarder(ctx, ep).start()
            previous = signal.signal(signal.SIGINT, self._on_sigint)
            previous_term = signal.signal(signal.SIGTERM, _raise_system_exit)
            self._setup_sharing()
            meter.begin_window("run")
            started = time.monotonic()
            self._next_phase(started)
            try:
                self._start_services(ep)
                self.slots = [self._start_actor(ep, i, 0) for i in range(self.cfg.actors)]
                self._serve(ep, telemetry_sock, control_sock, started)
                self._drain(telemetry_sock, control_sock, started)
            except BaseException:
                self._kill_all()
                raise
            finally:
                signal.signal(signal.SIGINT, previous)
                signal.signal(signal.SIGTERM, previous_term)
                wall_s = time.monotonic() - started
                self._close_phase(started)
                try:
                    energy = meter.end_window("run")
                except ValueError:
                    energy = None
                forwarder.stop()
                ctx.destroy(linger=0)
                if self.mps is not None:
                    self.mps.stop()
        return build_result(self, wall_s, energy)

    def _close_phase(self, started: float) -> None:
        phase = self.phases[-1] if self.phases else None
        if phase is None or phase.end_s is not None:
            return
        phase.end_s = time.monotonic() - started
        phase.trained_steps = self.telemetry.trained_steps - phase.trained_at_start
        try:
            phase.energy = self._meter.end_window(f"phase-{phase.generation}")
        except ValueError:
            phase.energy = None

    def _serve(self, ep: topology.Endpoints, telemetry_sock: zmq.Socket,
               control_sock: zmq.Socket, started: float) -> None:  # fmt: skip
        max_wall = self.cfg.max_wall_s
        changes = list(self.mps_changes)
        while not self.stop_requested:
            self._read_telemetry(telemetry_sock, int(TICK_S * 1000))
            self._check_processes(ep)
            self._send_retire(control_sock)
            if changes and time.monotonic() - started >= changes[0][0]:
                self._requested.append(changes.pop(0)[1])
            while self._requested:
                self.replace_gmis(ep, control_sock, self._requested.pop(0), started)
            if self.on_progress is not None:
                self.on_progress(self.state(started))
            if self.telemetry.trained_steps >= self.cfg.steps:
                break
            if max_wall is not None and time.monotonic() - started >= max_wall:
                logger.info("wall-clock limit of %.0f s reached; draining", max_wall)
                break

    def _drain(self, telemetry_sock: zmq.Socket, control_sock: zmq.Socket, started: float) -> None:
        self._stop_event.set()
        deadline = time.monotonic() + ACTOR_EXIT_TIMEOUT_S
        clean: dict[str, int] = {}
        for slot in self.slots:
            while slot.process.is_alive() and time.monotonic() < deadline:
                self._read_telemetry(telemetry_sock, int(TICK_S * 1000))
                self._check_services()
                if self.on_progress is not None:
                    self.on_progress(self.state(started, draining=True))
            if slot.process.is_alive():
                logger.error("actor %d.%d did not stop in time; killing it", slot.index,
                             slot.incarnation)  # fmt: skip
                slot.process.kill()
                slot.process.join()
            ok = slot.process.exitcode == 0
            self._end_actor(slot, died=not ok)
            if ok:
                key = f"{slot.index}:{slot.incarnation}"
                clean[key] = self.ended.stepped[key]
        self.slots = []
        for name in ("compressor", "migrator", *self.trainer_names()):
            self._await_final(name, telemetry_sock, control_sock, clean, started)
        deadline = time.monotonic() + SERVICE_EXIT_TIMEOUT_S
        while any(p.is_alive() for p in self.services.values()) and time.monotonic() < deadline:
            wire.send_msg(control_sock, wire.MsgType.CONTROL, {"cmd": "exit"})
            for proc in self.services.values():
                proc.join(timeout=0.1)

    def _await_final(self, name: str, telemetry_sock: zmq.Socket, control_sock: zmq.Socket,
                     clean: dict[str, int], started: float) -> None:  # fmt: skip
        deadline = time.monotonic() + SERVICE_DRAIN_TIMEOUT_S
        last_sent = 0.0
        while not self.telemetry.is_final(name):
            now = time.monotonic()
            if now > deadline:
                raise RunError(f"{name} did not finish draining in {SERVICE_DRAIN_TIMEOUT_S} s")
            if not all(p.is_alive() for p in self.services.values()):
                self._read_telemetry(telemetry_sock, 200)  # a final report may still be queued
                self._check_services()
            self._send_retire(control_sock)
            if name == "compressor" and now - last_sent >= DRAIN_RESEND_S:
                wire.send_msg(control_sock, wire.MsgType.CONTROL, {"cmd": "drain", "expect": clean})
                last_sent = now
            self._read_telemetry(telemetry_sock, int(TICK_S * 1000))
            if self.on_progress is not None:
                self.on_progress(self.state(started, draining=True))

    def _kill_all(self) -> None:
        if hasattr(self, "_stop_event"):
            self._stop_event.set()
        for proc in [s.process for s in self.slots] + list(self.services.values()):
            if proc.is_alive():
                proc.kill()
        for proc in [s.process for s in self.slots] + list(self.services.values()):
            proc.join(timeout=5)
