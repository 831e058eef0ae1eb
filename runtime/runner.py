"""Launches one training run as processes, watches it, restarts dead actors, and drains it.

    runner (this process) ── spawns ──▶ compressor, migrator, trainer GMIs, actor-0..A-1,
                                         and the inference GMI with ``inference='gmi'``

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
from runtime.gmi.fleet import GMIFleet
from runtime.inference import NAME as INFERENCE
from runtime.inference import inference_main
from runtime.phases import PhaseLog
from runtime.stages.compressor import compressor_main
from runtime.stages.migrator import migrator_main
from runtime.telemetry import RunTelemetry

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
        self.fleet = GMIFleet(cfg, info, self._spawn)
        self.mps_changes = sorted(mps_changes or [], key=lambda change: change[0])
        for _, pct in self.mps_changes:
            self.fleet.check(pct)  # raises ValueError now rather than mid-run
        self._requested: list[tuple[int, ...] | None] = []
        self.phases: PhaseLog | None = None
        self.on_progress = on_progress
        self.meter = meter
        self.mp = mp.get_context("spawn")
        self.telemetry = RunTelemetry()
        self.ended = _Incarnations()
        self.slots: list[_ActorSlot] = []
        self.services: dict[str, Any] = {}
        self.inference_place: Any = None
        """Where the inference GMI runs (``inference='gmi'``), else None."""
        self.restarts = 0
        self.stop_requested = False
        self.interrupted = False

    # --- processes -------------------------------------------------------------------------

    def _start_services(self, ep: topology.Endpoints) -> None:
        cfg = self.cfg
        specs = {
            "compressor": (compressor_main, (ep, cfg.chunk_bytes, cfg.chunk_timeout_s)),
            "migrator": (migrator_main, (ep, len(self.fleet.gmis))),
        }
        if cfg.inference == "gmi":
            self.inference_place = self.fleet.inference_place()
            specs[INFERENCE] = (inference_main, (cfg, self.info, ep, self.inference_place))
        for name, (target, args) in specs.items():
            self._spawn(name, target, args)
        self.fleet.start(ep, self.run_dir)

    def _spawn(self, name: str, target: Callable[..., None], args: tuple[Any, ...]) -> None:
        proc = self.mp.Process(target=target, args=args, name=name, daemon=True)
        proc.start()
        self.services[name] = proc

    @property
    def generation(self) -> int:
        """The current generation of trainer GMIs (0 until the first hand-over)."""
        return self.fleet.generation

    def trainer_names(self) -> list[str]:
        """Telemetry names of the current generation's GMIs."""
        return self.fleet.names()

    def request_replace(self, mps_pct: tuple[int, ...] | None = None) -> None:
        """Asks for a GMI hand-over at the next tick (from ``on_progress`` or a tuner).

        Raises:
            ValueError: if ``mps_pct`` does not fit the GMIs (checked now, not mid-run).
        """
        self.fleet.check(mps_pct)
        self._requested.append(mps_pct)

    def replace_gmis(self, ep: topology.Endpoints, control_sock: zmq.Socket,
                     mps_pct: tuple[int, ...] | None) -> None:  # fmt: skip
        """Replaces every GMI by a new generation, with percentages ``mps_pct`` (None: same).

        Experience keeps flowing to the new GMIs at once; the old ones retire, train what they
        hold and hand the learner state over (``runtime.gmi.fleet``). Nothing is dropped.
        """
        self.fleet.replace(ep, self.run_dir, control_sock, mps_pct)
        self.phases.begin(self.fleet.generation, [s.mps_pct for s in self.fleet.gmis],
                          self.telemetry.trained_steps)  # fmt: skip

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

        meter = self.meter if self.meter is not None else EnergyMeter()
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
            self.fleet.setup_sharing(any(pct is not None for _, pct in self.mps_changes))
            meter.begin_window("run")
            started = time.monotonic()
            self.phases = PhaseLog(meter, started)
            self.phases.begin(0, [s.mps_pct for s in self.fleet.gmis], 0)
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
                self.phases.end(self.telemetry.trained_steps)
                try:
                    energy = meter.end_window("run")
                except ValueError:
                    energy = None
                forwarder.stop()
                ctx.destroy(linger=0)
                self.fleet.stop()
        return build_result(self, wall_s, energy)

    def _serve(self, ep: topology.Endpoints, telemetry_sock: zmq.Socket,
               control_sock: zmq.Socket, started: float) -> None:  # fmt: skip
        max_wall = self.cfg.max_wall_s
        changes = list(self.mps_changes)
        while not self.stop_requested:
            self._read_telemetry(telemetry_sock, int(TICK_S * 1000))
            self._check_processes(ep)
            self.fleet.send_retire(control_sock, self.telemetry.source("migrator"))
            if changes and time.monotonic() - started >= changes[0][0]:
                self._requested.append(changes.pop(0)[1])
            while self._requested:
                self.replace_gmis(ep, control_sock, self._requested.pop(0))
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
            self.fleet.send_retire(control_sock, self.telemetry.source("migrator"))
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
