"""Compressor: incomplete rollouts are held while healthy, and evicted only when given up on."""

from __future__ import annotations

import numpy as np
import pytest
import zmq

from runtime import wire
from runtime.stages import compressor as comp
from runtime.stages import partials
from runtime.stages.dispenser import CHANNELS

T = 4


def rollout(actor: int, seq: int, rows: int = 2, width: int = 3) -> list[wire.Message]:
    """The channel messages of one rollout of actor ``actor`` (incarnation 0)."""
    arrays = {
        "obs": np.zeros((rows, T + 1, width), np.float32),
        "actions": np.zeros((rows, T), np.int64),
        "rewards": np.zeros((rows, T), np.float32),
        "dones": np.zeros((rows, T), np.uint8),
        "logp": np.zeros((rows, T), np.float32),
        "versions": np.zeros((rows, T), np.int32),
    }
    meta = {"actor": actor, "inc": 0, "seq": seq, "nch": len(CHANNELS), "steps": rows * T}
    return [
        wire.Message(wire.MsgType.ROLLOUT, meta | {"ci": ci, "ch": n, "rows": rows}, [arrays[n]])
        for ci, n in enumerate(CHANNELS)
    ]


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


class SlowMigratorPush:
    """The compressor's PUSH to a migrator that reads nothing during the compressor's first
    ``blocked_waits`` waits for room (each one moves the clock on by its timeout)."""

    def __init__(self, clock: Clock, blocked_waits: int) -> None:
        self.clock, self.blocked_waits, self.frames = clock, blocked_waits, 0

    def send(self, frame, flags=0, copy=True):
        if self.blocked_waits:
            raise zmq.Again()
        self.frames += 1

    def poll(self, timeout_ms, flags=0):
        self.clock.t += timeout_ms / 1000
        self.blocked_waits -= 1
        return 0


def test_time_blocked_on_the_migrator_neither_ages_rollouts_nor_ends_a_drain():
    """Actor 1's rollout is half in when the compressor blocks sending actor 0's chunk for
    longer than both the age limit and the drain's idle limit; its other channels were queued
    on the input meanwhile. Once the send goes through, the rollout is still held (and then
    completes) and the drain still waits for it."""
    clock = Clock()
    waits = int((partials.PARTIAL_MAX_AGE_S + comp.DRAIN_IDLE_S) / comp.STATS_INTERVAL_S) + 2
    push = SlowMigratorPush(clock, blocked_waits=waits)
    c = comp.Compressor(None, push, None, None, chunk_bytes=1, chunk_timeout_s=0.05)
    c.clock = clock
    late = rollout(actor=1, seq=0)
    c.handle(late[0])
    c.expect = {"1:0": 2 * T}
    c.last_input = clock()
    for m in rollout(actor=0, seq=0):
        c.handle(m)  # completes: the chunk is flushed, and blocks
    assert push.blocked_waits == 0 and push.frames > 0
    assert clock() - c.partial[(1, 0, 0)].first_at < partials.PARTIAL_MAX_AGE_S
    c.evict()
    assert not c._drained()
    for m in late[1:]:
        c.handle(m)
    assert c.counters["evicted_rollouts"] == 0 and c.counters["rollouts"] == 2
    assert c.complete_steps == {"0:0": 2 * T, "1:0": 2 * T} and c._drained()


def test_interleaved_large_rollouts_of_two_actors_both_complete(monkeypatch):
    """Two actors' rollouts, each near the per-rollout cap, arrive channel by channel
    interleaved: together they hold more than the cap, and neither is evicted for it."""
    c = comp.Compressor(None, None, None, None, chunk_bytes=1 << 30, chunk_timeout_s=10.0)
    a, b = rollout(actor=0, seq=0, width=64), rollout(actor=1, seq=0, width=64)
    one_rollout = sum(m.arrays[0].nbytes for m in a)
    monkeypatch.setattr(partials, "PARTIAL_MAX_BYTES", one_rollout)
    for ma, mb in zip(a, b, strict=True):
        c.handle(ma)
        c.handle(mb)
        c.evict()
    assert c.counters["evicted_rollouts"] == 0 and c.counters["rollouts"] == 2
    assert c.complete_steps == {"0:0": 2 * T, "1:0": 2 * T} and not c.partial


def test_past_the_cap_a_senders_older_rollout_goes_and_past_the_ceiling_the_oldest(
    monkeypatch, caplog
):
    """An actor that began a newer rollout lost the older one's channels: past the cap that one
    is evicted (with a warning that gives the counts), the other actor's is kept. Past the
    ceiling the oldest goes whoever sent it."""
    c = comp.Compressor(None, None, None, None, chunk_bytes=1 << 30, chunk_timeout_s=10.0)
    head = rollout(actor=0, seq=0)[0].arrays[0].nbytes
    monkeypatch.setattr(partials, "PARTIAL_MAX_BYTES", 2 * head)
    monkeypatch.setattr(partials, "PARTIAL_CEILING_BYTES", 3 * head)
    c.handle(rollout(actor=1, seq=0)[0])
    c.handle(rollout(actor=0, seq=0)[0])
    c.handle(rollout(actor=0, seq=1)[0])
    c.evict()
    assert sorted(c.partial) == [(0, 0, 1), (1, 0, 0)]
    assert "began a newer rollout" in caplog.text and "1 rollouts, 8 steps evicted" in caplog.text
    c.handle(rollout(actor=2, seq=0)[0])
    c.handle(rollout(actor=3, seq=0)[0])
    c.evict()
    assert sorted(c.partial) == [(0, 0, 1), (2, 0, 0), (3, 0, 0)]
    assert "above the ceiling" in caplog.text and c.counters["evicted_rollouts"] == 2


class RecordingPush:
    """The compressor's PUSH to the migrator: the messages sent, decoded."""

    def __init__(self) -> None:
        self.sent: list[wire.Message] = []
        self._parts: list[bytes] = []

    def send(self, frame, flags=0, copy=True):
        self._parts.append(bytes(frame))
        if not flags & zmq.SNDMORE:
            self.sent.append(wire.decode(self._parts))
            self._parts = []


def test_an_evicted_rollouts_steps_reach_its_actor_as_confirmed_and_stay_lost():
    """Actor 0's rollout loses a channel: evicted, its steps counted lost, and told (signed) to
    the migrator, whose receipts then confirm them to the actor, so its budget and its exit do
    not wait for them for ever. A copy of the message sent again confirms nothing more."""
    from runtime.stages import settled
    from runtime.stages.migrator import Migrator

    key, clock, push = b"k" * 32, Clock(), RecordingPush()
    c = comp.Compressor(None, push, None, None, chunk_bytes=1, chunk_timeout_s=10.0, key=key)
    c.clock = clock
    for m in rollout(actor=0, seq=0)[:-1]:  # its last channel never comes
        c.handle(wire.Message(m.type, wire.sign(key, m.type, m.meta, m.arrays), m.arrays))
    clock.t += partials.PARTIAL_MAX_AGE_S + 1
    c.evict()
    c.settled.send(push, key)
    assert c.counters["evicted_steps"] == 2 * T
    (told,) = [m for m in push.sent if m.type is wire.MsgType.SETTLED]
    migrator = Migrator(None, None, None, n_trainers=1, key=key)
    migrator.on_chunk(told, [])
    migrator.on_chunk(told, [])  # sent again: the counts are cumulative
    assert migrator.book.counts(0.0) == {"0:0": 2 * T}
    forged = wire.Message(wire.MsgType.SETTLED, {"settled": {"0:0": 10**6}}, [])
    with pytest.raises(wire.ProtocolError, match="signature"):
        migrator.on_chunk(forged, [])
    for bad in ({"x": 1}, {"0:0": -1}, [1]):
        with pytest.raises(wire.ProtocolError):
            settled.take({}, wire.Message(wire.MsgType.SETTLED, {"settled": bad}, []))


def test_an_ended_incarnation_is_named_in_the_receipts_until_confirmed_whole_and_a_while_after():
    """Actor 0 sends a whole rollout, part of another and its end of stream; actor 1 runs on.
    The compressor tells the migrator (signed) that actor 0 ended with every step it took of
    it. Once the receipts confirm them all (handed to a trainer, or given up on), actor 0 is
    named ``KEEP_S`` longer, then no more; actor 1 stays named."""
    from runtime.stages import receipt_book
    from runtime.stages.migrator import Migrator

    key, clock, push = b"k" * 32, Clock(), RecordingPush()
    c = comp.Compressor(None, push, None, None, chunk_bytes=1, chunk_timeout_s=10.0, key=key)
    c.clock = clock

    def signed(m: wire.Message) -> wire.Message:
        return wire.Message(m.type, wire.sign(key, m.type, m.meta, m.arrays), m.arrays)

    for m in rollout(0, 0) + rollout(0, 1)[:-1] + rollout(1, 0):
        c.handle(signed(m))
    c.handle(signed(wire.Message(wire.MsgType.EOS, {"actor": 0, "inc": 0, "rollouts": 2})))
    c.settled.send(push, key)
    migrator = Migrator(None, None, None, n_trainers=1, key=key)

    def told() -> wire.Message:
        (last,) = [m for m in push.sent if m.type is wire.MsgType.SETTLED][-1:]
        return last

    assert told().meta["ended"] == {"0:0": 4 * T}  # 2T whole, 2T of the part
    migrator.on_chunk(told(), [])
    book = migrator.book
    book.handed("0:0", 2 * T)  # the whole rollout's chunk went to a trainer
    book.handed("1:0", 2 * T)
    assert book.counts(0.0) == {"0:0": 2 * T, "1:0": 2 * T}
    clock.t += partials.PARTIAL_MAX_AGE_S + 1
    c.evict()  # the part is given up on: its steps are confirmed too
    c.settled.send(push, key)
    assert told().meta == {**told().meta, "settled": {"0:0": 2 * T}, "ended": {}}
    migrator.on_chunk(told(), [])
    assert book.counts(10.0) == {"0:0": 4 * T, "1:0": 2 * T}  # all of actor 0's: from 10 s on
    assert book.counts(10.0 + receipt_book.KEEP_S) == {"0:0": 4 * T, "1:0": 2 * T}
    assert book.counts(11.0 + receipt_book.KEEP_S) == {"1:0": 2 * T}
    snapshot = migrator.snapshot()
    assert snapshot["receipt_incarnations"] == 1 and snapshot["forgotten_incarnations"] == 1
    book.handed("1:0", 2 * T)  # a running incarnation is never forgotten
    assert book.counts(1e6) == {"1:0": 4 * T}


def test_a_settled_message_naming_ended_incarnations_badly_is_refused():
    from runtime.stages import settled

    for bad in ({"x": 1}, {"0:0": -1}, [1]):
        msg = wire.Message(wire.MsgType.SETTLED, {"settled": {}, "ended": bad}, [])
        with pytest.raises(wire.ProtocolError, match="SETTLED"):
            settled.take({}, msg)


def test_a_signed_rollout_rejected_whole_is_settled_to_its_actor_and_an_unsigned_one_is_not():
    """A rollout whose channels all came, signed by the run's key, but whose layout cannot be
    trained is rejected and its steps counted lost; its actor (named in the signed header) is
    told, so its in-flight budget and its exit do not wait for it. Without the run's key the
    header names no one reliably: nothing is settled."""
    key, push = b"k" * 32, RecordingPush()
    signed = comp.Compressor(None, push, None, None, chunk_bytes=1, chunk_timeout_s=10.0, key=key)
    plain = comp.Compressor(None, None, None, None, chunk_bytes=1, chunk_timeout_s=10.0)
    for c in (signed, plain):
        bad = rollout(actor=3, seq=0)
        bad[1] = wire.Message(bad[1].type, bad[1].meta, [np.zeros((2,), np.int64)])  # 1-D actions
        with pytest.raises(wire.ProtocolError, match="rejected: actions has shape"):
            for m in bad:
                meta = wire.sign(key, m.type, m.meta, m.arrays) if c is signed else m.meta
                c.handle(wire.Message(m.type, meta, m.arrays))
        assert c.counters["rejected_rollouts"] == 1 and c.complete_steps == {}
    assert plain.settled.steps == {} and not plain.settled.due
    signed.settled.send(push, key)
    (told,) = [m for m in push.sent if m.type is wire.MsgType.SETTLED]
    assert told.meta["settled"] == {"3:0": 2 * T}
