"""Compressor (system-wide service): concatenates channel messages from many actors into chunks.

Channel messages of one rollout arrive separately and interleaved with other actors'. The
compressor holds them until the rollout is complete (every channel present), then appends the
rollout to the open chunk. The chunk is flushed as one CHUNK message per channel when its bytes
reach ``chunk_bytes`` or ``chunk_timeout_s`` after its first rollout. Every channel message of a
chunk lists the same rollouts in the same order, so the channels stay aligned downstream.

Accounting: ``complete_steps`` per actor incarnation (what arrived whole). Memory is bounded:
incomplete rollouts are evicted by age or bytes held (``runtime.stages.partials``) and counted
(``evicted_rollouts``, ``evicted_steps``, each with a warning). Rollouts still incomplete at the
drain are reported as ``incomplete_steps``. The runner counts both kinds as lost: an actor died
mid-send, or some of its channel messages never came.
"""

from __future__ import annotations

import logging
import time

import numpy as np
import zmq

from runtime import topology, wire
from runtime.commands import CommandIn
from runtime.stages.common import LiveSettings, StatsSender, await_exit, init_service_process
from runtime.stages.dispenser import layout_problem
from runtime.stages.partials import Partials, Rollout
from runtime.stages.settled import Settled

logger = logging.getLogger(__name__)

STATS_INTERVAL_S = 0.5
DRAIN_IDLE_S = 10.0
"""A drain stops waiting for missing actor data after this long without any input."""


class Compressor:
    """The compressor's state and loop; sockets are injected (see ``topology``)."""

    def __init__(
        self,
        pull: zmq.Socket,
        push: zmq.Socket,
        commands: CommandIn | None,
        stats: StatsSender | None,
        chunk_bytes: int,
        chunk_timeout_s: float,
        key: bytes = b"",
    ) -> None:
        self.pull, self.push, self.commands, self.stats = pull, push, commands, stats
        self.key = key
        """The run's key: the actors' rollouts must be signed with it, and the chunks and the
        end of stream are (no check and no signature if empty)."""
        self.chunk_bytes = chunk_bytes
        self.chunk_timeout_s = chunk_timeout_s
        self.live = LiveSettings()
        self.clock = time.monotonic
        self.partials = Partials()
        self.settled = Settled()
        """The steps of evicted rollouts, told to their actors (``runtime.stages.settled``)."""
        self.last_seq: dict[tuple[int, int], int] = {}
        """The newest rollout begun, by (actor, incarnation): with the run's key, an older one
        is refused (a signed message sent again)."""
        self.pending: list[Rollout] = []
        self.pending_bytes = 0
        self.pending_since = 0.0
        self.next_chunk = 0
        self.malformed = wire.MalformedCounter("compressor")
        self.complete_steps: dict[str, int] = {}
        self.eos_seen: set[str] = set()
        self.expect: dict[str, int] | None = None
        self.last_input = self.clock()
        self.counters = {
            "messages_in": 0,
            "bytes_in": 0,
            "messages": 0,
            "bytes": 0,
            "chunks": 0,
            "rollouts": 0,
            "rejected_rollouts": 0,
            "evicted_rollouts": 0,
            "evicted_steps": 0,
        }
        self.first_inc: dict[int, int] = {}
        """Per actor slot, its first incarnation this compressor serves (one started in place
        of a dead one: the incarnations started after it; every older one is refused)."""

    @property
    def partial(self) -> dict[tuple[int, int, int], Rollout]:
        """The incomplete rollouts by (actor, incarnation, seq), oldest first."""
        return self.partials.rollouts

    @property
    def partial_bytes(self) -> int:
        return self.partials.nbytes

    # --- ingestion -----------------------------------------------------------------------

    def handle(self, msg: wire.Message) -> None:
        """Takes one message from the experience socket (with the run's key: only what one of
        the run's actors signed)."""
        if self.key:
            wire.check_signed(self.key, msg)
        actor, inc = wire.meta_int(msg.meta, "actor"), wire.meta_int(msg.meta, "inc")
        if inc < self.first_inc.get(actor, 0):
            raise wire.ProtocolError(
                f"a message of actor {actor}'s incarnation {inc}, which ran before this "
                "compressor replaced a dead one: sent again (replayed)"
            )
        if msg.type is wire.MsgType.EOS:
            self.eos_seen.add(f"{actor}:{inc}")
            partial = sum(r.steps for k, r in self.partial.items() if k[:2] == (actor, inc))
            self.settled.end(actor, inc, self.complete_steps.get(f"{actor}:{inc}", 0) + partial)
            return
        if msg.type is not wire.MsgType.ROLLOUT:
            raise wire.ProtocolError(f"compressor does not take {msg.type.value} messages")
        m = msg.meta
        key = (actor, inc, wire.meta_int(m, "seq"))
        ci, nch = wire.meta_int(m, "ci"), wire.meta_int(m, "nch")
        steps, rows, name = wire.meta_int(m, "steps"), wire.meta_int(m, "rows"), str(m.get("ch"))
        if len(msg.arrays) != 1 or msg.arrays[0].ndim < 1 or msg.arrays[0].shape[0] != rows:
            raise wire.ProtocolError(f"rollout channel {name!r} must be one array of {rows} rows")
        if not 0 <= ci < nch:
            raise wire.ProtocolError(f"channel index {ci} outside 0..{nch - 1}")
        self.counters["messages_in"] += 1
        self.counters["bytes_in"] += msg.nbytes
        rollout = self.partial.get(key)
        if rollout is None and self.key:  # signed: an actor sends its rollouts in order
            last = self.last_seq.get(key[:2], -1)
            if key[2] <= last:
                raise wire.ProtocolError(
                    f"rollout {key} after this actor incarnation's rollout {last} began: "
                    "a message sent again (replayed) or out of order"
                )
            self.last_seq[key[:2]] = key[2]
        if rollout is None:
            rollout = Rollout(key, nch, steps, rows, self.clock())
            self.partials.begin(rollout)
        elif (rollout.nch, rollout.steps, rollout.rows) != (nch, steps, rows) or (
            ci in rollout.channels
        ):
            raise wire.ProtocolError(f"channel {name!r} conflicts with rollout {key} so far")
        self.partials.add_channel(rollout, ci, name, msg.arrays[0])
        if len(rollout.channels) == nch:
            self.partials.pop(key)
            ordered = dict(rollout.channels[i] for i in range(nch))
            problem = layout_problem(ordered, steps)
            if problem:  # never counted complete: the runner counts its steps as lost
                self.counters["rejected_rollouts"] += 1
                if self.key:  # signed: the actor named sent it, and waits for it no more
                    self.settled.add(actor, inc, steps)
                raise wire.ProtocolError(f"rollout {key} rejected: {problem}")
            self._append(rollout)

    def evict(self, now: float | None = None) -> None:
        """Drops the incomplete rollouts given up on (``Partials.evict``); each is counted and
        warned about with the totals."""
        now = self.clock() if now is None else now
        for r, why in self.partials.evict(now):
            self.counters["evicted_rollouts"] += 1
            self.counters["evicted_steps"] += r.steps
            self.settled.add(r.key[0], r.key[1], r.steps)  # its actor waits for it no more
            logger.warning(
                "compressor: evicted rollout %s (%d steps, %d of %d channels): %s; counted as "
                "lost (%d rollouts, %d steps evicted so far; %d rollouts, %d bytes still held)",
                r.key,
                r.steps,
                len(r.channels),
                r.nch,
                why,
                self.counters["evicted_rollouts"],
                self.counters["evicted_steps"],
                len(self.partial),
                self.partial_bytes,
            )

    def _append(self, rollout: Rollout) -> None:
        if self.pending and not self._fits(rollout):
            self.flush()  # a different layout (e.g. a new rollout length) starts a new chunk
        if not self.pending:
            self.pending_since = self.clock()
        self.pending.append(rollout)
        self.pending_bytes += rollout.nbytes
        inc_key = f"{rollout.key[0]}:{rollout.key[1]}"
        self.complete_steps[inc_key] = self.complete_steps.get(inc_key, 0) + rollout.steps
        self.counters["rollouts"] += 1
        if self.pending_bytes >= self.chunk_bytes:
            self.flush()

    def _fits(self, rollout: Rollout) -> bool:
        first = self.pending[0]
        if first.nch != rollout.nch:
            return False
        for ci, (name, arr) in first.channels.items():
            other_name, other = rollout.channels[ci]
            if other_name != name or other.dtype != arr.dtype or other.shape[1:] != arr.shape[1:]:
                return False
        return True

    # --- output --------------------------------------------------------------------------

    def flush(self) -> None:
        """Sends the open chunk as one CHUNK message per channel (no-op when empty)."""
        if not self.pending:
            return
        chunk = self.next_chunk
        self.next_chunk += 1
        rollouts = [[*r.key, r.steps, r.rows] for r in self.pending]
        steps = sum(r.steps for r in self.pending)
        rows = sum(r.rows for r in self.pending)
        nch = self.pending[0].nch
        for ci in range(nch):
            name = self.pending[0].channels[ci][0]
            arrays = [r.channels[ci][1] for r in self.pending]
            data = arrays[0] if len(arrays) == 1 else np.concatenate(arrays)
            meta = {
                "ch": name,
                "ci": ci,
                "nch": nch,
                "chunk": chunk,
                "rollouts": rollouts,
                "steps": steps,
                "rows": rows,
            }
            if self.key:
                meta = wire.sign(self.key, wire.MsgType.CHUNK, meta, [data])
            self.counters["bytes"] += self._send(meta, data)
            self.counters["messages"] += 1
        self.counters["chunks"] += 1
        self.pending = []
        self.pending_bytes = 0

    def _send(self, meta: dict, data: np.ndarray) -> int:
        """Sends one CHUNK channel, waiting while the migrator applies back-pressure; meanwhile
        it keeps reporting, so the runner tells a blocked compressor from a stuck one. The
        time blocked is left out of the rollouts' ages and of the drain's idle time: the input
        was not read meanwhile, so what is missing may be queued there."""
        blocked_at = None
        while True:
            try:
                sent = wire.send_msg(self.push, wire.MsgType.CHUNK, meta, [data], zmq.NOBLOCK)
            except zmq.Again:
                blocked_at = self.clock() if blocked_at is None else blocked_at
                self.push.poll(int(STATS_INTERVAL_S * 1000), zmq.POLLOUT)
                if self.stats is not None:
                    self.stats.send(self.snapshot())
                continue
            if blocked_at is not None:
                blocked = self.clock() - blocked_at
                self.partials.pause(blocked)
                self.last_input += blocked
            return sent

    def snapshot(self, final: bool = False) -> dict[str, object]:
        """Counters for telemetry; ``final`` marks the last report after a drain."""
        incomplete = sum(r.steps for r in self.partial.values())
        return {
            **self.counters,
            "malformed": self.malformed.count,
            "complete_steps": dict(self.complete_steps),
            "incomplete_steps": incomplete,
            "incomplete_rollouts": len(self.partial),
            "chunk_bytes": self.chunk_bytes,
            "live_epoch": self.live.epoch,
            "final": final,
        }

    # --- loop ----------------------------------------------------------------------------

    def _drained(self) -> bool:
        """After a drain command: every expected actor incarnation sent its EOS or all its
        steps, or nothing arrived for ``DRAIN_IDLE_S`` (what is missing is then lost, and the
        runner counts it)."""
        if self.expect is None:
            return False
        waiting = [
            key
            for key, steps in self.expect.items()
            if key not in self.eos_seen and self.complete_steps.get(key, 0) < steps
        ]
        if not waiting:
            return True
        if self.clock() - self.last_input > DRAIN_IDLE_S:
            logger.error("compressor: drain gave up waiting for actors %s", waiting)
            return True
        return False

    def _handle_command(self, msg: wire.Message) -> None:
        settings = self.live.take(msg)
        if settings is not None:
            self.chunk_bytes = settings["chunk_bytes"]
            self.chunk_timeout_s = settings["chunk_timeout_s"]
            logger.info(
                "compressor: chunks of %d bytes, %.3f s timeout (live epoch %d)",
                self.chunk_bytes,
                self.chunk_timeout_s,
                self.live.epoch,
            )
        if msg.type is wire.MsgType.COMMAND and msg.meta.get("cmd") == "drain":
            if self.expect is None:
                self.last_input = self.clock()
            expect = msg.meta.get("expect", {})
            if not isinstance(expect, dict):
                raise wire.ProtocolError(f"drain 'expect' must be a map, got {expect!r}")
            self.expect = {str(k): wire.meta_int(expect, k) for k in expect}
            logger.info("compressor draining; waiting for %d actors", len(self.expect))

    def run(self) -> None:
        """Serves until a drain completes, then flushes, sends EOS downstream and returns."""
        poller = zmq.Poller()
        poller.register(self.pull, zmq.POLLIN)
        if self.commands is not None:
            poller.register(self.commands.sock, zmq.POLLIN)
        last_stats = self.clock()
        while not self._drained():
            timeout_ms = max(1, int(min(self.chunk_timeout_s / 2, STATS_INTERVAL_S) * 1000))
            for sock, _ in poller.poll(timeout_ms):
                # at most a queue's worth per socket, so commands, flushes and stats keep up
                for msg in wire.recv_waiting(sock, self.malformed, topology.EXPERIENCE_HWM):
                    try:
                        if sock is self.pull:
                            self.handle(msg)
                        else:  # signed by the runner, and new (runtime.commands)
                            self._handle_command(self.commands.check(msg))
                    except wire.ProtocolError as exc:
                        self.malformed.drop(exc)
                        continue
                    if sock is self.pull:  # taken: junk does not hold a drain's give-up off
                        self.last_input = self.clock()
            now = self.clock()
            if self.pending and now - self.pending_since >= self.chunk_timeout_s:
                self.flush()
            if self.partial:
                self.evict(now)
            self.settled.send(self.push, self.key)
            if self.stats is not None and now - last_stats >= STATS_INTERVAL_S:
                self.stats.send(self.snapshot())
                last_stats = now
        self.flush()
        if self.partial:
            logger.warning(
                "compressor: %d rollouts (%d steps) incomplete at the drain: their actors died "
                "mid-send, or some of their channel messages never came",
                len(self.partial),
                sum(r.steps for r in self.partial.values()),
            )
        eos = {"stage": "compressor"}
        if self.key:
            eos = wire.sign(self.key, wire.MsgType.EOS, eos)
        wire.send_msg(self.push, wire.MsgType.EOS, eos)
        if self.stats is not None:
            self.stats.send(self.snapshot(final=True))


def compressor_main(
    endpoints: topology.Endpoints,
    chunk_bytes: int,
    chunk_timeout_s: float,
    first_chunk: int = 0,
    first_inc: dict[int, int] | None = None,
) -> None:
    """Process entry point of the compressor service. A compressor started in place of a dead
    one numbers its chunks from ``first_chunk``, above every id the old one used (trainers take
    chunk ids as increasing), and takes each actor slot's incarnations from ``first_inc`` on
    (those started after it: a copy of an older one's rollout is refused)."""
    init_service_process("compressor")
    ctx = zmq.Context()
    stats = StatsSender.service(ctx, endpoints, "compressor")  # its guard first, then binds
    pull, push, commands = topology.compressor_sockets(ctx, endpoints)
    compressor = Compressor(
        pull, push, commands, stats, chunk_bytes, chunk_timeout_s, endpoints.run_key
    )
    compressor.next_chunk, compressor.first_inc = first_chunk, dict(first_inc or {})
    compressor.run()
    await_exit(commands)
    stats.guard.stop()
    ctx.destroy(linger=topology.LINGER_MS)
