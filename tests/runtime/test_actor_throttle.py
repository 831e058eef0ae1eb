"""An actor held back by its throttle keeps reporting, so an actor never confirmed shows."""

from __future__ import annotations

from runtime import actor as actor_module
from runtime.actor import Actor


class NoReceipts:
    """The migrator's receipts for an incarnation whose rollouts were never handed on."""

    received = 0

    def poll(self, timeout_ms: int = 0) -> int:
        return self.received


class Idle:
    def poll(self) -> None:
        pass


class StopAfter:
    """A stop event set once ``reports`` reports were seen (or after many checks, so that an
    actor that never reports ends the test instead of hanging it)."""

    def __init__(self, reports: list, want: int) -> None:
        self.reports, self.want, self.checks = reports, want, 0

    def is_set(self) -> bool:
        self.checks += 1
        return len(self.reports) >= self.want or self.checks > 10_000


def test_an_actor_waiting_on_receipts_that_never_come_keeps_reporting(monkeypatch):
    monkeypatch.setattr(actor_module, "STATS_INTERVAL_S", 0.0)
    monkeypatch.setattr(actor_module, "THROTTLE_POLL_MS", 0)
    a = Actor.__new__(Actor)
    a.receipts, a.policy, a.commands = NoReceipts(), Idle(), None
    a.sent_steps, a.budget, a.waits = 64, 32, 0
    reports: list[int] = []
    a.report = lambda final=False: reports.append(a.sent_steps - a.receipts.received)
    stop = StopAfter(reports, want=3)
    a._throttle(stop, last_stats=0.0)
    assert reports == [64, 64, 64] and a.waits >= 3


def test_with_the_runs_key_an_actor_takes_only_signed_receipts():
    """A forged receipt (unsigned, or signed with another key) could let an actor exit before
    its steps were delivered: it is dropped and counted; a genuine one is taken."""
    import zmq

    from runtime import wire
    from runtime.receipts import Receipts

    key = b"k" * 32
    ctx = zmq.Context()
    pub, sub = ctx.socket(zmq.PUB), ctx.socket(zmq.SUB)
    pub.bind("inproc://receipts")
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.connect("inproc://receipts")
    receipts = Receipts(sub, "3:0", key)
    try:
        forged = [{"received": {"3:0": 10**6}}]
        forged.append(wire.sign(b"x" * 32, wire.MsgType.RECEIPT, {"received": {"3:0": 10**6}}))
        genuine = wire.sign(key, wire.MsgType.RECEIPT, {"received": {"3:0": 256}})
        while receipts.received == 0:  # a PUB drops what goes before its subscriber joined
            for meta in (*forged, genuine):
                wire.send_msg(pub, wire.MsgType.RECEIPT, meta)
            receipts.poll(50)
        assert receipts.received == 256 and receipts.malformed.count >= 2
    finally:
        ctx.destroy(linger=0)
