"""Migrator (system-wide service): routes chunks to the trainer with the least queued work.

Credit-based flow control: each trainer's batcher announces free chunk slots (CREDIT messages,
with its queued steps). A chunk goes to a trainer that has a free slot, preferring the least
queued steps; every channel message of that chunk follows it to the same trainer. With no
credit anywhere, chunks wait in a bounded queue; when that is full the migrator stops reading
its input, and back-pressure reaches the compressor and then the actors through the sockets'
high-water marks. Nothing is dropped.

Receipts: when a chunk is handed to a trainer, the steps of each actor incarnation in it are
added to cumulative counts that the migrator publishes (RECEIPT, ``runtime.stages.receipt_book``).
Actors throttle on them (end-to-end back-pressure) and exit only once everything they sent is
counted. The migrator outlives every trainer, so the counts survive GMI hand-overs.

Generations: trainer identities are ``trainer-<rank>.g<generation>``. The runner's COMMAND
``retire`` for a generation stops new chunks going to its trainers; once the chunks already
routed to one are complete, it gets RETIRE (after which nothing more comes) and hands its
learner state to the next generation, which asks for chunks once it has loaded it. The final EOS
goes to every trainer not retired.

A migrator started in place of a dead one first tells each trainer the lowest chunk id it
routes (FIRST_CHUNK), so that the dead one's chunks still on the way take no new slot.

A trainer that disconnects (its process died) is marked gone: what was routed to it is lost,
and the supervisor replaces it together with the pipeline. The migrator does not die of it.
"""

from __future__ import annotations

import collections
import logging
import time
from dataclasses import dataclass

import zmq

from runtime import topology, wire
from runtime.commands import CommandIn
from runtime.stages.common import StatsSender, await_exit, init_service_process
from runtime.stages.credits import CreditCheck
from runtime.stages.leftovers import count_leftovers
from runtime.stages.receipt_book import REFRESH_S, ReceiptBook

logger = logging.getLogger(__name__)

MAX_PENDING_MESSAGES = topology.CHUNK_HWM
STATS_INTERVAL_S = 0.5


def generation_of(identity: bytes) -> int:
    """The generation in a ``trainer-<rank>.g<generation>`` identity (0 when absent)."""
    _, sep, gen = identity.rpartition(b".g")
    return int(gen) if sep and gen.isdigit() else 0


@dataclass
class _Trainer:
    identity: bytes
    credits: int = 0
    queued_steps: int = 0
    chunks: int = 0
    steps: int = 0
    open_routes: int = 0
    retiring: bool = False
    retired: bool = False
    gone: bool = False
    """Its process has disconnected (``EHOSTUNREACH``): it died, and the supervisor replaces it
    with the pipeline; nothing more is sent to it."""


class Migrator:
    """The migrator's routing state and loop; sockets are injected (see ``topology``).

    Args:
        pull: Chunk input from the compressor.
        router: ROUTER to the trainers' DEALERs.
        stats: Telemetry sender, or None.
        n_trainers: Trainers of the current generation that must have said hello before the
            final EOS goes out.
        receipts: PUB for the receipts, or None (tests).
        commands: SUB for the runner's COMMAND (``retire``), or None.
        key: The run's key: chunks, their end of stream and credits must be signed with it
            (``runtime.wire.check_signed``); anything else is dropped and counted. Empty: no
            check (tests that drive the migrator alone).
    """

    def __init__(
        self,
        pull: zmq.Socket,
        router: zmq.Socket,
        stats: StatsSender | None,
        n_trainers: int,
        receipts: zmq.Socket | None = None,
        commands: CommandIn | None = None,
        key: bytes = b"",
    ) -> None:
        self.pull, self.router, self.stats = pull, router, stats
        self.key = key
        self.commands = commands
        self.n_trainers = n_trainers
        self.generation = 0
        self.retired_generations: set[int] = set()
        self.trainers: dict[bytes, _Trainer] = {}
        self.routes: dict[int, tuple[_Trainer, int]] = {}
        self.pending: collections.deque[tuple[wire.Message, list[zmq.Frame]]] = collections.deque()
        self.last_chunk: tuple[int, set[int]] = (-1, set())
        """The newest chunk begun and its channels so far (signed chunks come in order, each
        channel once: anything older is refused)."""
        self.credits = CreditCheck(key)
        self.first_chunk = 0
        """The first id of the compressor started with this migrator: above 0, a trainer's
        first message from it says so (FIRST_CHUNK: chunks below are a dead migrator's, whose
        slots the trainer granted again, ``Batcher.reset``)."""
        self.upstream_done = False
        self.malformed = wire.MalformedCounter("migrator")
        self.counters = {"messages": 0, "bytes": 0, "chunks": 0, "retired": 0, "undelivered": 0}
        self.counters["abandoned_routes"] = 0
        self.book = ReceiptBook(receipts, key)
        """The receipts: steps confirmed by actor incarnation."""

    def on_trainer(self, identity: bytes, msg: wire.Message) -> None:
        """A CREDIT message from a trainer (``credits.CreditCheck``): adds its free slots and
        records its queue."""
        taken = self.credits.take(identity, msg)
        if taken is None:  # granted to the migrator this one replaced
            return
        n, queued = taken
        trainer = self.trainers.get(identity)
        if trainer is None:
            trainer = self.trainers[identity] = _Trainer(identity)
            if self.first_chunk:
                frames = wire.encode(wire.MsgType.FIRST_CHUNK, {"chunk": self.first_chunk})
                self._send_to(trainer, frames)
            if generation_of(identity) in self.retired_generations:
                self._begin_retire(trainer)
        if trainer.retiring:
            return  # credit sent before it learned of its retirement
        trainer.credits += n
        trainer.queued_steps = queued

    def retire(self, generation: int, next_trainers: int) -> None:
        """Stops routing new chunks to ``generation``'s trainers; RETIRE follows their last.

        Args:
            generation: The generation being replaced.
            next_trainers: Trainers in the generation that replaces it (for the final EOS).
        """
        if generation in self.retired_generations:
            return  # a resent retire, or one a replaced migrator was started past
        self.retired_generations.add(generation)
        if generation + 1 >= self.generation:  # a late copy of an older retire: not the count
            self.n_trainers = next_trainers
        self.generation = max(self.generation, generation + 1)
        for trainer in self.trainers.values():
            if generation_of(trainer.identity) == generation:
                self._begin_retire(trainer)

    def _begin_retire(self, trainer: _Trainer) -> None:
        trainer.retiring = True
        trainer.credits = 0
        self._retire_if_done(trainer)

    def _retire_if_done(self, trainer: _Trainer) -> None:
        if trainer.retiring and not trainer.retired and trainer.open_routes == 0:
            self._send_to(trainer, wire.encode(wire.MsgType.RETIRE, {}))
            trainer.retired = True
            self.counters["retired"] += 1

    def _send_to(self, trainer: _Trainer, frames: list) -> bool:
        """Sends one message to ``trainer``; False (and the trainer marked gone) when its
        process has disconnected, which only a death does (a retired trainer gets nothing
        after RETIRE). The supervisor then replaces it and this migrator; until then the
        migrator routes on rather than dying first and hiding which process failed."""
        if trainer.gone:
            return False
        try:
            wire.send(self.router, [trainer.identity, *frames])
        except zmq.ZMQError as exc:
            if exc.errno != zmq.EHOSTUNREACH:
                raise
            logger.warning("%s has disconnected; no more chunks go to it", trainer.identity)
            trainer.gone = trainer.retiring = trainer.retired = True
            trainer.credits = 0
            return False
        return True

    def on_chunk(self, msg: wire.Message, frames: list[zmq.Frame]) -> None:
        """A message from the compressor: a chunk channel to route, its end of stream, or the
        steps of rollouts it gave up on (SETTLED)."""
        if self.key and msg.type in (wire.MsgType.EOS, wire.MsgType.CHUNK, wire.MsgType.SETTLED):
            wire.check_signed(self.key, msg)
        if msg.type is wire.MsgType.SETTLED:  # steps given up: their actors wait for them no more
            self.book.take_settled(msg)
            return
        if msg.type is wire.MsgType.EOS:
            if msg.meta.get("stage") != "compressor":  # an actor's, copied off its link
                raise wire.ProtocolError("an end of stream that is not the compressor's")
            self.upstream_done = True
            return
        if msg.type is not wire.MsgType.CHUNK:
            raise wire.ProtocolError(f"migrator expects chunk messages, got {msg.type.value}")
        for key in ("chunk", "nch", "steps"):
            wire.meta_int(msg.meta, key)  # validated here so dispatch() cannot fail on them
        wire.meta_rollouts(msg.meta)
        chunk, ci = msg.meta["chunk"], wire.meta_int(msg.meta, "ci", 0)
        last, seen = self.last_chunk
        if self.key and (chunk < last or (chunk == last and ci in seen)):
            raise wire.ProtocolError(
                f"chunk {chunk} channel {ci} after chunk {last} began: sent again (replayed)"
            )
        if chunk > last:
            self.last_chunk = (chunk, set())
        self.last_chunk[1].add(ci)
        self.pending.append((msg, frames))

    def dispatch(self) -> None:
        """Forwards pending chunk channels, in order, as far as credits allow."""
        while self.pending:
            msg, frames = self.pending[0]
            chunk = msg.meta["chunk"]
            route = self.routes.get(chunk)
            if route is None:
                self._close_routes_before(chunk)
                trainer = self._pick()
                if trainer is None:
                    return
                trainer.credits -= 1
                trainer.chunks += 1
                trainer.steps += msg.meta["steps"]
                trainer.queued_steps += msg.meta["steps"]
                trainer.open_routes += 1
                self.counters["chunks"] += 1
                route = (trainer, msg.meta["nch"])
                for actor, inc, _seq, steps, *_ in msg.meta["rollouts"]:
                    self.book.handed(f"{actor}:{inc}", steps)
            trainer, remaining = route
            if self._send_to(trainer, frames):
                self.counters["messages"] += 1
                self.counters["bytes"] += msg.nbytes
            else:
                self.counters["undelivered"] += 1  # the supervisor counts its steps as lost
            if remaining > 1:
                self.routes[chunk] = (trainer, remaining - 1)
            else:
                self.routes.pop(chunk, None)
                trainer.open_routes -= 1
                self._retire_if_done(trainer)
            self.pending.popleft()

    def _close_routes_before(self, chunk: int) -> None:
        """Closes the routes of chunks before ``chunk`` still open: a channel of theirs was
        dropped (malformed) and none will come, as the compressor sends a chunk's channels
        before the next chunk's. Their trainer's batcher gives the part up (its steps count as
        lost); a retiring trainer would otherwise wait for its RETIRE for ever."""
        for old in [c for c in self.routes if c < chunk]:
            trainer, _ = self.routes.pop(old)
            trainer.open_routes -= 1
            self.counters["abandoned_routes"] += 1
            self._retire_if_done(trainer)

    def _pick(self) -> _Trainer | None:
        ready = [t for t in self.trainers.values() if t.credits > 0 and not t.retiring]
        if not ready:
            return None
        return min(ready, key=lambda t: (t.queued_steps, -t.credits))

    def snapshot(self, final: bool = False) -> dict[str, object]:
        per_trainer = {
            t.identity.decode(errors="replace"): {
                "chunks": t.chunks,
                "steps": t.steps,
                "credits": t.credits,
                "queued_steps": t.queued_steps,
            }
            for t in self.trainers.values()
        }
        return {
            **self.counters,
            "pending": len(self.pending),
            "malformed": self.malformed.count,
            "trainers": per_trainer,
            "retired_generations": sorted(self.retired_generations),
            "receipt_incarnations": len(self.book.received),
            "forgotten_incarnations": self.book.forgotten,
            "final": final,
        }

    def _active(self) -> list[_Trainer]:
        return [t for t in self.trainers.values() if not t.retiring]

    def _finished(self) -> bool:
        return self.upstream_done and not self.pending and len(self._active()) >= self.n_trainers

    def run(self) -> None:
        """Routes until the compressor's EOS has been forwarded, then sends EOS to each trainer."""
        last_stats = time.monotonic()
        both, trainers_only = zmq.Poller(), zmq.Poller()
        for poller in (both, trainers_only):
            poller.register(self.router, zmq.POLLIN)
            if self.commands is not None:
                poller.register(self.commands.sock, zmq.POLLIN)
        both.register(self.pull, zmq.POLLIN)
        while not self._finished():
            reading = len(self.pending) < MAX_PENDING_MESSAGES and not self.upstream_done
            for sock, _ in (both if reading else trainers_only).poll(10):
                if self.commands is not None and sock is self.commands.sock:
                    self._read_commands()
                else:
                    self._read(sock)
            self.dispatch()
            now = time.monotonic()
            self.book.publish(now)
            if self.stats is not None and now - last_stats >= STATS_INTERVAL_S:
                self.stats.send(self.snapshot())
                last_stats = now
        count_leftovers(self.pull, self.key, self.malformed)
        for trainer in self._active():
            self._send_to(trainer, wire.encode(wire.MsgType.EOS, {}))
        self.book.publish(time.monotonic() + REFRESH_S)
        if self.stats is not None:
            self.stats.send(self.snapshot(final=True))

    def _read_commands(self) -> None:
        for msg in self.commands.waiting(self.malformed):
            if msg.meta.get("cmd") != "retire":
                continue  # drain and exit are for other services / after the run
            try:
                self.retire(
                    wire.meta_int(msg.meta, "generation"), wire.meta_int(msg.meta, "next_trainers")
                )
            except wire.ProtocolError as exc:
                self.malformed.drop(exc)
                continue
            if self.stats is not None:
                self.stats.send(self.snapshot())  # the runner resends until it sees this

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


def migrator_main(
    endpoints: topology.Endpoints,
    n_trainers: int,
    generation: int = 0,
    first_chunk: int = 0,
    epoch: int = 0,
) -> None:
    """Process entry point of the migrator service. One started in place of a dead one is told
    the current GMI ``generation`` (every older one is retired: a GMI of one that still says
    hello gets RETIRE at once, and hands over), the first chunk id of the compressor started
    with it (``first_chunk``: a copy of an older compressor's chunk is refused) and the
    pipeline reset ``epoch`` (it takes credits granted under it only). Its guard starts before
    its binds."""
    init_service_process("migrator")
    ctx = zmq.Context()
    stats = StatsSender.service(ctx, endpoints, "migrator")
    pull, router, receipts, commands = topology.migrator_sockets(ctx, endpoints)
    migrator = Migrator(pull, router, stats, n_trainers, receipts, commands, endpoints.run_key)
    migrator.generation, migrator.retired_generations = generation, set(range(generation))
    migrator.credits.epoch, migrator.last_chunk = epoch, (first_chunk - 1, set())
    migrator.first_chunk = first_chunk
    migrator.run()
    await_exit(commands)
    stats.guard.stop()
    ctx.destroy(linger=topology.LINGER_MS)
