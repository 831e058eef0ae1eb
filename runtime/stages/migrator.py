"""Migrator (system-wide service): routes chunks to the trainer with the least queued work.

Credit-based flow control: each trainer's batcher announces free chunk slots (CREDIT messages,
with its queued steps). A chunk goes to a trainer that has a free slot, preferring the least
queued steps; every channel message of that chunk follows it to the same trainer. With no
credit anywhere, chunks wait in a bounded queue; when that is full the migrator stops reading
its input, and back-pressure reaches the compressor and then the actors through the sockets'
high-water marks. Nothing is dropped.
"""

from __future__ import annotations

import collections
import logging
import time
from dataclasses import dataclass

import zmq

from runtime import topology, wire
from runtime.stages.common import StatsSender, await_exit, init_service_process

logger = logging.getLogger(__name__)

MAX_PENDING_MESSAGES = topology.CHUNK_HWM
TRAINER_PREFIX = b"trainer-"
"""Only peers with this identity prefix (``topology.trainer_experience_in``) get chunks."""
STATS_INTERVAL_S = 0.5


@dataclass
class _Trainer:
    identity: bytes
    credits: int = 0
    queued_steps: int = 0
    chunks: int = 0
    steps: int = 0


class Migrator:
    """The migrator's routing state and loop; sockets are injected (see ``topology``).

    Args:
        pull: Chunk input from the compressor.
        router: ROUTER to the trainers' DEALERs.
        stats: Telemetry sender, or None.
        n_trainers: Trainers that must have said hello before the final EOS goes out.
    """

    def __init__(
        self, pull: zmq.Socket, router: zmq.Socket, stats: StatsSender | None, n_trainers: int
    ) -> None:
        self.pull, self.router, self.stats = pull, router, stats
        self.n_trainers = n_trainers
        self.trainers: dict[bytes, _Trainer] = {}
        self.routes: dict[int, tuple[_Trainer, int]] = {}
        self.pending: collections.deque[tuple[wire.Message, list[zmq.Frame]]] = collections.deque()
        self.upstream_done = False
        self.malformed = wire.MalformedCounter("migrator")
        self.counters = {"messages": 0, "bytes": 0, "chunks": 0}

    def on_trainer(self, identity: bytes, msg: wire.Message) -> None:
        """A CREDIT message from a trainer: adds its free slots and records its queue."""
        if msg.type is not wire.MsgType.CREDIT:
            raise wire.ProtocolError(f"migrator takes only credit from trainers, got {msg.type}")
        if not identity.startswith(TRAINER_PREFIX):
            raise wire.ProtocolError(f"credit from {identity!r}, which is not a trainer")
        n = wire.meta_int(msg.meta, "n")
        queued = wire.meta_int(msg.meta, "queued_steps", 0)
        if n < 0:
            raise wire.ProtocolError(f"credit of {n} slots; must be >= 0")
        trainer = self.trainers.setdefault(identity, _Trainer(identity))
        trainer.credits += n
        trainer.queued_steps = queued

    def on_chunk(self, msg: wire.Message, frames: list[zmq.Frame]) -> None:
        """A message from the compressor: a chunk channel to route, or its end of stream."""
        if msg.type is wire.MsgType.EOS:
            self.upstream_done = True
            return
        if msg.type is not wire.MsgType.CHUNK:
            raise wire.ProtocolError(f"migrator expects chunk messages, got {msg.type.value}")
        for key in ("chunk", "nch", "steps"):
            wire.meta_int(msg.meta, key)  # validated here so dispatch() cannot fail on them
        self.pending.append((msg, frames))

    def dispatch(self) -> None:
        """Forwards pending chunk channels, in order, as far as credits allow."""
        while self.pending:
            msg, frames = self.pending[0]
            chunk = msg.meta["chunk"]
            route = self.routes.get(chunk)
            if route is None:
                trainer = self._pick()
                if trainer is None:
                    return
                trainer.credits -= 1
                trainer.chunks += 1
                trainer.steps += msg.meta["steps"]
                trainer.queued_steps += msg.meta["steps"]
                self.counters["chunks"] += 1
                route = (trainer, msg.meta["nch"])
            trainer, remaining = route
            wire.send(self.router, [trainer.identity, *frames])
            self.counters["messages"] += 1
            self.counters["bytes"] += msg.nbytes
            if remaining > 1:
                self.routes[chunk] = (trainer, remaining - 1)
            else:
                self.routes.pop(chunk, None)
            self.pending.popleft()

    def _pick(self) -> _Trainer | None:
        ready = [t for t in self.trainers.values() if t.credits > 0]
        if not ready:
            return None
        return min(ready, key=lambda t: (t.queued_steps, -t.credits))

    def snapshot(self, final: bool = False) -> dict[str, object]:
        per_trainer = {t.identity.decode(errors="replace"): {"chunks": t.chunks, "steps": t.steps}
                       for t in self.trainers.values()}  # fmt: skip
        return {**self.counters, "pending": len(self.pending), "malformed": self.malformed.count,
                "trainers": per_trainer, "final": final}  # fmt: skip

    def _finished(self) -> bool:
        return self.upstream_done and not self.pending and len(self.trainers) >= self.n_trainers

    def run(self) -> None:
        """Routes until the compressor's EOS has been forwarded, then sends EOS to each trainer."""
        last_stats = time.monotonic()
        both, trainers_only = zmq.Poller(), zmq.Poller()
        for poller in (both, trainers_only):
            poller.register(self.router, zmq.POLLIN)
        both.register(self.pull, zmq.POLLIN)
        while not self._finished():
            reading = len(self.pending) < MAX_PENDING_MESSAGES and not self.upstream_done
            for sock, _ in (both if reading else trainers_only).poll(50):
                self._read(sock)
            self.dispatch()
            now = time.monotonic()
            if self.stats is not None and now - last_stats >= STATS_INTERVAL_S:
                self.stats.send(self.snapshot())
                last_stats = now
        for trainer in self.trainers.values():
            wire.send(self.router, [trainer.identity, *wire.encode(wire.MsgType.EOS, {})])
        if self.stats is not None:
            self.stats.send(self.snapshot(final=True))

    def _read(self, sock: zmq.Socket) -> None:
        budget = MAX_PENDING_MESSAGES
        while budget > 0:
            budget -= 1
            try:
                frames = sock.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            try:
                if sock is self.router:
                    self.on_trainer(bytes(frames[0].bytes), wire.decode(frames[1:]))
                else:
                    self.on_chunk(wire.decode(frames), frames)
                    if len(self.pending) >= MAX_PENDING_MESSAGES:
                        return
            except wire.ProtocolError as exc:
                self.malformed.drop(exc)


def migrator_main(endpoints: topology.Endpoints, n_trainers: int) -> None:
    """Process entry point of the migrator service."""
    init_service_process("migrator")
    ctx = zmq.Context()
    pull, router, control = topology.migrator_sockets(ctx, endpoints)
    stats = StatsSender(topology.telemetry_out(ctx, endpoints), "migrator")
    Migrator(pull, router, stats, n_trainers).run()
    await_exit(control)
    ctx.destroy(linger=topology.LINGER_MS)
