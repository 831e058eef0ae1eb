"""Ending a run without losing experience (the runner's last step).

Actors finish their current rollout, send it and an EOS, and exit once the trainer confirmed
receipt. The compressor is told how many steps each actor incarnation that exited cleanly sent,
waits for them (or their EOS), flushes and passes EOS on; the migrator forwards everything and
passes EOS on; each trainer GMI trains what is left and reports. Only then are the services
told to exit: closing a socket earlier could drop its queued tail.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import zmq

from runtime import commands
from runtime.inference import NAME as INFERENCE
from runtime.services import PIPELINE, RunError, Services

ACTOR_EXIT_TIMEOUT_S = 60.0
"""How long the drain waits for actors to finish their rollout and exit, while nothing trains
(``Patience``)."""
SERVICE_DRAIN_TIMEOUT_S = 120.0
"""How long the drain waits for each service's final report, while nothing trains."""
DRAIN_CEILING_S = 3600.0
"""The longest any step of the drain waits, however the run trains meanwhile."""
UPDATE_WAITS = 3
"""A drain step waits at least this many of the run's longest gaps between trained steps."""
DRAIN_RESEND_S = 0.5
SERVICE_EXIT_TIMEOUT_S = 30.0
DRAIN_EXIT_S = 1.0
"""What a drain takes beyond training the steps in flight: the processes' exits."""


def wall_reserve_s(cfg: Any, rate: float) -> float:
    """How long before ``cfg.max_wall_s`` the drain begins, so that the run ends by then: the
    steps that can be in flight (the actors' budget and a rollout each) at ``rate`` trained
    steps/s (0: none known yet), and the processes' exits; at most half the limit."""
    rollouts = cfg.actors * cfg.envs_per_actor * cfg.rollout_len
    inflight = cfg.max_inflight_batches * cfg.batch_size + rollouts
    need = (inflight / rate if rate > 0 else 0.0) + DRAIN_EXIT_S
    return min(need, 0.5 * cfg.max_wall_s)


@dataclass
class Patience:
    """How long a step of the drain waits: ``base_s`` (at least ``UPDATE_WAITS`` times
    ``update_s``, the run's longest gap between trained steps) after the run last trained a
    step, or after the step began; never past ``DRAIN_CEILING_S`` from its start. The drain
    trains what is in flight, so a learner that takes minutes per update keeps it waiting as
    long as it trains, and one that stops training does not."""

    base_s: float
    update_s: float = 0.0
    started: float = field(default_factory=time.monotonic)
    _trained: int | None = None
    _since: float = 0.0

    def deadline(self, trained: int, now: float | None = None) -> float:
        """The time (``time.monotonic()``) the step gives up, with the run at ``trained``."""
        now = time.monotonic() if now is None else now
        if self._trained is None or trained > self._trained:
            self._trained, self._since = trained, max(now, self.started)
        wait = max(self.base_s, UPDATE_WAITS * self.update_s)
        return min(self._since + wait, self.started + DRAIN_CEILING_S)


SETTLE_S = 5.0
"""How long after a run's first trained batch the drain's rate waits for a second one before
it falls back on the rate counted from the run's start."""


class TrainedRate:
    """The run's trained steps/s since its first trained step, which the drain's reserve goes
    by. Counted from the start of the run instead, the rate carries the start-up (probes,
    process starts, a GPU learner's graph capture): on a 75-s Ant-v5 run on a 16-core H200 host
    the first 16,384-sample batch landed 12.5 s in, that rate (1.3k/s, against 28k after) put
    the reserve at its cap, and the run drained 15 s after it began. Before two trained counts
    there is no such rate: none (0) for ``SETTLE_S`` after the first, then the start-up one (a
    learner that takes a minute per update must not wait for a second before it drains)."""

    def __init__(self) -> None:
        self._first: tuple[float, int] | None = None
        self._last: tuple[float, int] | None = None
        self.longest_gap_s = 0.0
        """The longest time between two advances of the trained steps (``Patience``)."""

    def observe(self, trained: int, started: float, now: float | None = None) -> float:
        """Takes the run's trained step count (at ``now``, ``time.monotonic()``; the run began
        at ``started``); returns the rate the drain's reserve goes by (0: none yet)."""
        now = time.monotonic() if now is None else now
        if trained <= 0:
            return 0.0
        if self._first is None:
            self._first = (now, trained)
        elif trained > (self._last or self._first)[1]:
            self.longest_gap_s = max(self.longest_gap_s, now - (self._last or self._first)[0])
            self._last = (now, trained)
        if self._last is not None and self._last[0] > self._first[0]:
            return (self._last[1] - self._first[1]) / (self._last[0] - self._first[0])
        if now - self._first[0] < SETTLE_S or now <= started:
            return 0.0
        return trained / (now - started)


def wall_due(cfg: Any, since: float, rate: float) -> bool:
    """Whether the drain must begin now for the run to end by ``cfg.max_wall_s`` counted from
    ``since`` (``time.monotonic()``), training at ``rate`` steps/s (``TrainedRate``)."""
    if cfg.max_wall_s is None:
        return False
    return cfg.max_wall_s - (time.monotonic() - since) <= wall_reserve_s(cfg, rate)


@dataclass
class Drain:
    """The drain of one run.

    Attributes:
        actors: The run's ``runtime.actor_pool.ActorPool``.
        services: Its service processes.
        fleet: Its ``runtime.gmi.fleet.GMIFleet`` (retiring GMIs still get RETIRE).
        telemetry: Its ``runtime.telemetry.RunTelemetry``.
        read: Reads telemetry from a socket for up to the given milliseconds.
        report: Called every tick while draining (the progress display).
        tick_s: The runner's tick: how long each wait reads telemetry.
        update_s: The run's longest gap between trained steps (``Patience``).
    """

    actors: Any
    services: Services
    fleet: Any
    telemetry: Any
    read: Callable[[zmq.Socket, int], None]
    report: Callable[[], None]
    tick_s: float
    update_s: float = 0.0

    def run(self, telemetry_sock: zmq.Socket, command_sock: commands.CommandOut) -> None:
        """Drains the pipeline in order, then lets the services exit.

        Raises:
            RunError: a service died, or did not report its final counters in time.
        """

        patience = Patience(ACTOR_EXIT_TIMEOUT_S, self.update_s)

        def wait() -> None:
            self.read(telemetry_sock, int(self.tick_s * 1000))
            self.services.check(self.telemetry.is_final)
            self.actors.hold_leaving(patience.deadline(self.telemetry.trained_steps))
            self.report()

        self.actors.drain(wait, ACTOR_EXIT_TIMEOUT_S)
        clean = dict(self.actors.ended.clean)
        for name in (*PIPELINE, *self.fleet.names()):
            self._await_final(name, telemetry_sock, command_sock, clean)
        deadline = time.monotonic() + SERVICE_EXIT_TIMEOUT_S
        self.services.exit_all(command_sock, deadline)
        # the inference GMI reports its final counters as it exits: read them
        while (
            INFERENCE in self.services
            and not self.telemetry.is_final(INFERENCE)
            and time.monotonic() < deadline
        ):
            self.read(telemetry_sock, int(self.tick_s * 1000))

    def _await_final(
        self,
        name: str,
        telemetry_sock: zmq.Socket,
        command_sock: commands.CommandOut,
        clean: dict[str, int],
    ) -> None:
        patience = Patience(SERVICE_DRAIN_TIMEOUT_S, self.update_s)
        last_sent = 0.0
        while not self.telemetry.is_final(name):
            now = time.monotonic()
            if now > patience.deadline(self.telemetry.trained_steps, now):
                raise RunError(
                    f"{name} did not finish draining: nothing trained for "
                    f"{max(SERVICE_DRAIN_TIMEOUT_S, UPDATE_WAITS * self.update_s):.0f} s "
                    f"(or {DRAIN_CEILING_S:.0f} s passed)"
                )
            if not self.services.all_alive():
                self.read(telemetry_sock, 200)  # a final report may still be queued
                self.services.check(self.telemetry.is_final)
            self.fleet.send_retire(command_sock, self.telemetry.source("migrator"))
            due = now - last_sent >= DRAIN_RESEND_S and not self.fleet.retire_pending
            if name == "compressor" and due:
                command_sock.send({"cmd": "drain", "expect": clean})
                last_sent = now
            self.read(telemetry_sock, int(self.tick_s * 1000))
            self.report()
