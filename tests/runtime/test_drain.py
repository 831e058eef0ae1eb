"""The drain's order: the compressor's end of stream waits until the migrator has taken every
GMI retirement (a new generation on standby would otherwise wait for ever for a learner state
the old one, sent EOS instead of RETIRE, never writes)."""

from __future__ import annotations

import types

from runtime import wire
from runtime.drain import Drain


class Commands:
    """The runner's COMMAND socket: keeps the commands sent."""

    def __init__(self) -> None:
        self.sent: list[dict] = []
        self._parts: list[bytes] = []

    def send(self, frame, flags=0, copy=True):
        self._parts.append(bytes(frame))
        if not flags & 2:  # the last frame (zmq.SNDMORE is 2)
            self.sent.append(wire.decode(self._parts).meta)
            self._parts = []


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
        telemetry=types.SimpleNamespace(is_final=is_final, source=lambda name: {}),
        read=lambda sock, ms: None,
        report=lambda: None,
        tick_s=0.0,
    )
    drain.run(telemetry_sock=None, command_sock=commands)
    assert drained_at == [5]  # not before the fifth retire round, when the migrator confirmed
    assert commands.sent[0] == {"cmd": "drain", "expect": {"0:0": 64}}
