"""The drain's order: the compressor's end of stream waits until the migrator has taken every
GMI retirement (a new generation on standby would otherwise wait for ever for a learner state
the old one, sent EOS instead of RETIRE, never writes); and how long it waits: while the run
trains what is in flight, however slow its learner, and not once it stops training."""

from __future__ import annotations

import time
import types

import pytest

from runtime import drain as drain_mod
from runtime.drain import Drain, Patience, TrainedRate
from runtime.services import RunError


class Commands:
    """The runner's COMMAND socket: keeps the commands sent."""

    def __init__(self) -> None:
        self.sent: list[dict] = []

    def send(self, meta: dict, flags: int = 0) -> None:
        self.sent.append(meta)


class Fleet:
    """A fleet whose old generation the migrator confirms retired after ``confirm_after``
    calls of ``send_retire``."""

    def __init__(self, confirm_after: int) -> None:
        self.calls, self.confirm_after = 0, confirm_after

    def names(self) -> list[str]:
        return []

    def send_retire(self, command_sock, migrator, reported=None, force=False) -> None:
        self.calls += 1

    @property
    def retire_pending(self) -> bool:
        return self.calls < self.confirm_after


class Services:
    """Every service alive; none is the inference GMI."""

    def all_alive(self) -> bool:
        return True

    def check(self, final) -> None:
        pass

    def exit_all(self, sock, deadline) -> None:
        pass

    def __contains__(self, name: str) -> bool:
        return False


def test_the_compressor_is_told_to_drain_only_once_the_retirements_are_confirmed():
    commands, fleet = Commands(), Fleet(confirm_after=5)
    drained_at: list[int] = []

    def is_final(name: str) -> bool:  # the compressor ends once it was told to drain
        if any(c.get("cmd") == "drain" for c in commands.sent) and not drained_at:
            drained_at.append(fleet.calls)
        return bool(drained_at) or name != "compressor"

    drain = Drain(
        actors=types.SimpleNamespace(
            drain=lambda wait, timeout: None, ended=types.SimpleNamespace(clean={"0:0": 64})
        ),
        services=Services(),
        fleet=fleet,
        telemetry=types.SimpleNamespace(is_final=is_final, source=lambda name: {}, trained_steps=0),
        read=lambda sock, ms: None,
        report=lambda: None,
        tick_s=0.0,
    )
    drain.run(telemetry_sock=None, command_sock=commands)
    assert drained_at == [5]  # not before the fifth retire round, when the migrator confirmed
    assert commands.sent[0] == {"cmd": "drain", "expect": {"0:0": 64}}


def test_patience_moves_with_the_trained_steps_and_stops_at_its_ceiling():
    p = Patience(base_s=60.0, update_s=0.0, started=0.0)
    assert p.deadline(100, now=0.0) == 60.0
    assert p.deadline(100, now=50.0) == 60.0  # nothing trained since: the same deadline
    assert p.deadline(164, now=55.0) == 115.0  # trained: it moves
    slow = Patience(base_s=60.0, update_s=90.0, started=0.0)  # a learner of 90 s per update
    assert slow.deadline(0, now=0.0) == drain_mod.UPDATE_WAITS * 90.0
    late = drain_mod.DRAIN_CEILING_S + 10.0
    assert p.deadline(10**6, now=late) == drain_mod.DRAIN_CEILING_S  # never past the ceiling


def test_the_trained_rate_keeps_the_longest_gap_between_trained_steps():
    pace = TrainedRate()
    for now, trained in ((10.0, 1024), (11.0, 2048), (11.5, 2048), (40.0, 3072), (41.0, 4096)):
        pace.observe(trained, started=0.0, now=now)
    assert pace.longest_gap_s == 29.0  # 11 s to 40 s: an update of a slow learner


def _service_drain(trained):
    """A drain of one service (the compressor) whose final report comes after 1 s, the run at
    ``trained()`` steps at each read."""
    began = time.monotonic()
    telemetry = types.SimpleNamespace(
        is_final=lambda name: time.monotonic() - began > 1.0,
        source=lambda name: {},
        trained_steps=0,
    )

    def read(sock, ms):
        time.sleep(0.02)
        telemetry.trained_steps = trained()

    actors = types.SimpleNamespace(
        drain=lambda wait, timeout: None, ended=types.SimpleNamespace(clean={})
    )
    return Drain(actors, Services(), Fleet(0), telemetry, read, lambda: None, 0.0)


def test_a_service_that_trains_slowly_is_waited_for_and_one_that_stopped_is_not(monkeypatch):
    """The service's report comes after 1 s, past a 0.3-s wait: the drain waits while the run
    trains meanwhile, and gives up with a reason when nothing trains (what is tested here is
    that timeout, so it waits on seconds)."""
    monkeypatch.setattr(drain_mod, "SERVICE_DRAIN_TIMEOUT_S", 0.3)
    monkeypatch.setattr(drain_mod, "PIPELINE", ("compressor",))
    steps = iter(range(0, 10**9, 64))
    _service_drain(lambda: next(steps)).run(None, Commands())  # trains: waited for
    with pytest.raises(RunError, match="nothing trained for 0 s"):
        _service_drain(lambda: 0).run(None, Commands())
