"""Migrator: credit-based, least-queued routing that keeps a chunk's channels together."""

from __future__ import annotations

import numpy as np
import pytest
import zmq

from runtime import wire
from runtime.stages.migrator import Migrator
from runtime.supervisor import CHUNK_ID_STRIDE


class FakeRouter:
    """Records what would be sent to each trainer identity."""

    def __init__(self) -> None:
        self.sent: list[tuple[bytes, wire.Message]] = []

    def send(self, frame, flags=0, copy=True):
        self._parts = [*getattr(self, "_parts", []), frame]
        if not flags:
            identity, *frames = self._parts
            self.sent.append((bytes(identity), wire.decode([bytes(f) for f in frames])))
            self._parts = []


def chunk(chunk_id: int, ci: int, steps: int = 10) -> tuple[wire.Message, list]:
    meta = {
        "chunk": chunk_id,
        "ci": ci,
        "nch": 2,
        "steps": steps,
        "ch": f"c{ci}",
        "rows": 1,
        "rollouts": [[chunk_id % 2, 0, chunk_id, steps]],
    }
    frames = wire.encode(wire.MsgType.CHUNK, meta, [np.zeros((1, 2), np.float32)])
    return wire.decode(frames), [bytes(f) for f in frames]


def credit(n: int, queued: int) -> wire.Message:
    return wire.Message(wire.MsgType.CREDIT, {"n": n, "queued_steps": queued})


def test_routes_to_least_queued_trainer_with_credit_and_keeps_channels_together():
    router = FakeRouter()
    m = Migrator(pull=None, router=router, stats=None, n_trainers=2)
    m.on_trainer(b"trainer-0", credit(1, queued=100))
    m.on_trainer(b"trainer-1", credit(2, queued=0))
    for cid in range(4):
        for ci in range(2):
            m.on_chunk(*chunk(cid, ci))
    m.dispatch()
    routed = [(ident, msg.meta["chunk"], msg.meta["ci"]) for ident, msg in router.sent]
    # trainer-1 (empty queue) gets chunk 0; then queues even out and credits run out at 3 chunks
    assert [r[0] for r in routed[:2]] == [b"trainer-1"] * 2
    assert {(c, ident) for ident, c, _ in routed} == {
        (0, b"trainer-1"),
        (1, b"trainer-1"),
        (2, b"trainer-0"),
    }
    assert len(m.pending) == 2  # chunk 3 waits for credit, both channels
    m.on_trainer(b"trainer-0", credit(1, queued=0))
    m.dispatch()
    assert [(i, msg.meta["chunk"]) for i, msg in router.sent[-2:]] == [(b"trainer-0", 3)] * 2
    assert not m.pending and not m.routes


def test_credit_from_a_peer_that_is_not_a_trainer_is_refused():
    import pytest

    m = Migrator(pull=None, router=FakeRouter(), stats=None, n_trainers=1)
    with pytest.raises(wire.ProtocolError, match="not a trainer"):
        m.on_trainer(b"\x00\x8b\x45\x67\x89", credit(5, queued=0))
    assert m.trainers == {}


def test_receipts_count_the_steps_of_each_actor_incarnation_handed_to_a_trainer():
    m = Migrator(pull=None, router=FakeRouter(), stats=None, n_trainers=1)
    m.on_trainer(b"trainer-0.g0", credit(3, queued=0))
    for cid in range(4):
        for ci in range(2):
            m.on_chunk(*chunk(cid, ci, steps=10))
    m.dispatch()
    # three credits: chunks 0..2 routed (actor 0 has chunks 0 and 2, actor 1 chunk 1)
    assert m.book.received == {"0:0": 20, "1:0": 10}
    assert len(m.pending) == 2


def test_retire_stops_new_chunks_and_sends_retire_after_the_open_chunk():
    router = FakeRouter()
    m = Migrator(pull=None, router=router, stats=None, n_trainers=1)
    m.on_trainer(b"trainer-0.g0", credit(4, queued=0))
    m.on_chunk(*chunk(0, 0))  # half of chunk 0: its route stays open
    m.dispatch()
    m.retire(0, next_trainers=1)
    assert [msg.type for _, msg in router.sent] == [wire.MsgType.CHUNK]  # not yet retired
    m.on_chunk(*chunk(0, 1))
    m.on_chunk(*chunk(1, 0))
    m.on_chunk(*chunk(1, 1))
    m.dispatch()
    sent = [(ident, msg.type, msg.meta.get("chunk")) for ident, msg in router.sent]
    assert sent == [
        (b"trainer-0.g0", wire.MsgType.CHUNK, 0),
        (b"trainer-0.g0", wire.MsgType.CHUNK, 0),
        (b"trainer-0.g0", wire.MsgType.RETIRE, None),
    ]
    assert len(m.pending) == 2  # chunk 1 waits for the next generation, whole
    m.on_trainer(b"trainer-0.g0", credit(2, queued=0))  # a late credit of the retired one
    m.on_trainer(b"trainer-0.g1", credit(1, queued=0))
    m.dispatch()
    assert [ident for ident, _ in router.sent[3:]] == [b"trainer-0.g1"] * 2
    assert not m.pending


def test_a_chunk_whose_channel_never_came_does_not_hold_its_trainers_retire_for_ever():
    """Channel 1 of chunk 0 was dropped on the way (malformed): once the next chunk is to be
    routed, chunk 0's route is closed (its trainer's batcher gives the part up), so the
    retiring trainer gets its RETIRE and the next generation its chunks."""
    router = FakeRouter()
    m = Migrator(pull=None, router=router, stats=None, n_trainers=1)
    m.on_trainer(b"trainer-0.g0", credit(4, queued=0))
    m.on_chunk(*chunk(0, 0))
    m.dispatch()
    m.retire(0, next_trainers=1)
    for ci in (0, 1):
        m.on_chunk(*chunk(1, ci))
    m.dispatch()
    sent = [(ident, msg.type, msg.meta.get("chunk")) for ident, msg in router.sent]
    assert sent == [
        (b"trainer-0.g0", wire.MsgType.CHUNK, 0),
        (b"trainer-0.g0", wire.MsgType.RETIRE, None),
    ]
    assert m.routes == {} and m.counters["abandoned_routes"] == 1
    m.on_trainer(b"trainer-0.g1", credit(1, queued=0))
    m.dispatch()
    assert [(i, msg.meta.get("chunk")) for i, msg in router.sent[2:]] == [(b"trainer-0.g1", 1)] * 2
    assert not m.pending and m.counters["abandoned_routes"] == 1


def test_a_retire_that_comes_after_a_later_ones_leaves_the_current_trainer_count():
    """Generation 0 was replaced by 2 GMIs, then generation 1 by 3; the first retire comes
    last (resent): the migrator keeps waiting for the 3 GMIs now running, not 2."""
    m = Migrator(pull=None, router=FakeRouter(), stats=None, n_trainers=1)
    m.retire(1, next_trainers=3)
    m.retire(0, next_trainers=2)
    assert m.generation == 2 and m.n_trainers == 3
    m.retire(2, next_trainers=1)
    assert m.generation == 3 and m.n_trainers == 1


def test_a_trainer_of_a_retired_generation_that_says_hello_late_is_retired_at_once():
    router = FakeRouter()
    m = Migrator(pull=None, router=router, stats=None, n_trainers=1)
    m.retire(0, next_trainers=1)
    m.on_trainer(b"trainer-1.g0", credit(4, queued=0))
    assert [(ident, msg.type) for ident, msg in router.sent] == [
        (b"trainer-1.g0", wire.MsgType.RETIRE)
    ]


def test_with_the_runs_key_only_signed_chunks_end_of_stream_and_credits_count():
    """Anyone of the same user can connect to the migrator's sockets; with the run's key it
    takes only what the run's compressor and trainers signed, and counts the rest."""
    key = b"k" * 32
    router = FakeRouter()
    m = Migrator(pull=None, router=router, stats=None, n_trainers=1, key=key)

    def signed(kind, meta, arrays=()):
        return wire.Message(kind, wire.sign(key, kind, meta, arrays), list(arrays))

    forged = [
        (b"trainer-0", credit(5, queued=0)),  # unsigned
        (b"trainer-0", signed(wire.MsgType.CREDIT, {"n": 5, "queued_steps": 0, "src": "x"})),
        (b"trainer-0", wire.Message(wire.MsgType.CREDIT, {"n": 5, "queued_steps": 0, "sig": "0"})),
    ]
    for identity, msg in forged:
        with pytest.raises(wire.ProtocolError):
            m.on_trainer(identity, msg)
    msg, frames = chunk(0, 0)
    with pytest.raises(wire.ProtocolError, match="without a valid signature"):
        m.on_chunk(msg, frames)  # unsigned chunk
    with pytest.raises(wire.ProtocolError, match="without a valid signature"):
        m.on_chunk(wire.Message(wire.MsgType.EOS, {"stage": "compressor"}), [])
    assert not m.upstream_done and not m.pending and not m.trainers

    good = {"n": 1, "queued_steps": 0, "src": "trainer-0", "cseq": 0}
    m.on_trainer(b"trainer-0", signed(wire.MsgType.CREDIT, good))
    meta = dict(msg.meta)
    tampered = signed(wire.MsgType.CHUNK, meta, msg.arrays)
    tampered.arrays = [msg.arrays[0] + 1]  # the header as signed, other bytes
    with pytest.raises(wire.ProtocolError, match="without a valid signature"):
        m.on_chunk(tampered, frames)
    m.on_chunk(signed(wire.MsgType.CHUNK, meta, msg.arrays), frames)
    m.dispatch()
    assert [ident for ident, _ in router.sent] == [b"trainer-0"]
    # an actor's end of stream, signed with the run's key, copied onto the chunk input
    actor_eos = signed(wire.MsgType.EOS, {"actor": 0, "inc": 1, "rollouts": 3})
    with pytest.raises(wire.ProtocolError, match="not the compressor's"):
        m.on_chunk(actor_eos, [])
    assert not m.upstream_done
    m.on_chunk(signed(wire.MsgType.EOS, {"stage": "compressor"}), [])
    assert m.upstream_done


def test_a_signed_chunk_or_credit_sent_again_is_refused():
    """A copy of a signed message, sent again by whoever could read a link, is refused by its
    number: chunks come in order with each channel once, credits are numbered per trainer."""
    key = b"k" * 32
    router = FakeRouter()
    m = Migrator(pull=None, router=router, stats=None, n_trainers=1, key=key)

    def signed(kind, meta, arrays=()):
        return wire.Message(kind, wire.sign(key, kind, meta, arrays), list(arrays))

    def credit_msg(cseq):
        return wire.Message(wire.MsgType.CREDIT, wire.credit_meta(key, "trainer-0", 2, 0, cseq))

    with pytest.raises(wire.ProtocolError, match="or below 0"):  # its first: no crash
        m.on_trainer(b"trainer-0", credit_msg(-1))
    m.on_trainer(b"trainer-0", credit_msg(0))
    with pytest.raises(wire.ProtocolError, match="sent again"):
        m.on_trainer(b"trainer-0", credit_msg(0))
    assert m.trainers[b"trainer-0"].credits == 2
    m.on_trainer(b"trainer-0", credit_msg(1))
    assert m.trainers[b"trainer-0"].credits == 4
    sent = [chunk(c, ci) for c in (0, 1) for ci in (0, 1)]
    sent = [(signed(wire.MsgType.CHUNK, msg.meta, msg.arrays), frames) for msg, frames in sent]
    m.on_chunk(*sent[0])
    with pytest.raises(wire.ProtocolError, match="sent again"):
        m.on_chunk(*sent[0])  # the same channel of the open chunk
    for msg in sent[1:]:
        m.on_chunk(*msg)
    for old in sent[:2]:
        with pytest.raises(wire.ProtocolError, match="sent again"):
            m.on_chunk(*old)  # a chunk before the newest
    m.dispatch()
    assert [(i, msg.meta["chunk"]) for i, msg in router.sent] == [(b"trainer-0", 0)] * 2 + [
        (b"trainer-0", 1)
    ] * 2


def test_a_migrator_started_in_place_of_a_dead_one_takes_nothing_of_the_old_pipeline():
    """The first restart's migrator takes chunks from its compressor's first id on (a copy of
    one the old compressor sent is refused) and counts only credits granted under its reset:
    a trainer's credits to the dead migrator, sent before it took the reset, would add to the
    window it grants again at the reset."""
    key = b"k" * 32
    router = FakeRouter()
    m = Migrator(pull=None, router=router, stats=None, n_trainers=1, key=key)
    m.credits.epoch, m.last_chunk = 1, (CHUNK_ID_STRIDE - 1, set())  # as migrator_main sets

    def credit_msg(cseq, epoch):
        meta = wire.credit_meta(key, "trainer-0", 2, 0, cseq, epoch)
        return wire.Message(wire.MsgType.CREDIT, meta)

    m.on_trainer(b"trainer-0", credit_msg(7, 0))  # granted before the reset: not counted
    assert b"trainer-0" not in m.trainers and not m.malformed.count
    m.on_trainer(b"trainer-0", credit_msg(8, 1))
    assert m.trainers[b"trainer-0"].credits == 2
    old, frames = chunk(5, 0)
    old = wire.Message(old.type, wire.sign(key, old.type, old.meta, old.arrays), old.arrays)
    with pytest.raises(wire.ProtocolError, match="sent again"):
        m.on_chunk(old, frames)
    new, frames = chunk(CHUNK_ID_STRIDE, 0)
    m.on_chunk(
        wire.Message(new.type, wire.sign(key, new.type, new.meta, new.arrays), new.arrays), frames
    )
    m.dispatch()
    assert [msg.meta["chunk"] for _, msg in router.sent] == [CHUNK_ID_STRIDE]


class DeadPeerRouter(FakeRouter):
    """A ROUTER_MANDATORY socket whose peer ``dead`` has disconnected."""

    def __init__(self, dead: bytes) -> None:
        super().__init__()
        self.dead = dead

    def send(self, frame, flags=0, copy=True):
        if not getattr(self, "_parts", []) and bytes(frame) == self.dead:
            raise zmq.ZMQError(zmq.EHOSTUNREACH)
        super().send(frame, flags, copy)


def test_a_trainer_that_disconnected_gets_nothing_more_and_the_migrator_routes_on():
    router = DeadPeerRouter(dead=b"trainer-0.g0")
    m = Migrator(pull=None, router=router, stats=None, n_trainers=2)
    m.on_trainer(b"trainer-0.g0", credit(4, queued=0))
    m.on_trainer(b"trainer-1.g0", credit(4, queued=50))
    m.on_chunk(*chunk(0, 0))
    m.on_chunk(*chunk(0, 1))
    m.dispatch()  # trainer-0 (least queued) is picked, and found gone
    assert router.sent == [] and m.counters["undelivered"] == 2
    assert m.trainers[b"trainer-0.g0"].gone and m.trainers[b"trainer-0.g0"].credits == 0
    m.on_chunk(*chunk(1, 0))
    m.on_chunk(*chunk(1, 1))
    m.dispatch()
    assert [(i, msg.meta["chunk"]) for i, msg in router.sent] == [(b"trainer-1.g0", 1)] * 2
    assert not m.pending and not m.routes


def test_a_replacement_migrator_tells_each_trainer_its_first_chunk_before_any_chunk():
    """A trainer that took the reset tells the dead migrator's late chunks from this one's by
    the id in FIRST_CHUNK (``Batcher.reset``); the first migrator of a run sends none."""
    router = FakeRouter()
    m = Migrator(pull=None, router=router, stats=None, n_trainers=1)
    m.on_trainer(b"trainer-0", credit(2, queued=0))
    assert router.sent == []
    router = FakeRouter()
    m = Migrator(pull=None, router=router, stats=None, n_trainers=1)
    m.first_chunk = CHUNK_ID_STRIDE
    m.on_trainer(b"trainer-0", credit(2, queued=0))
    m.on_trainer(b"trainer-0", credit(1, queued=0))
    for ci in range(2):
        m.on_chunk(*chunk(CHUNK_ID_STRIDE, ci))
    m.dispatch()
    types = [(ident, msg.type) for ident, msg in router.sent]
    assert (
        types
        == [(b"trainer-0", wire.MsgType.FIRST_CHUNK)] + [(b"trainer-0", wire.MsgType.CHUNK)] * 2
    )
    assert router.sent[0][1].meta == {"chunk": CHUNK_ID_STRIDE}
