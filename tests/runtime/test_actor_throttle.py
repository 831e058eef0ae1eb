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
