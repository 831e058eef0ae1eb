"""The runner's telemetry takes, with the run's key, only reports its own processes signed:
each from the one sender of its name, in order, and none from a process that was replaced."""

from __future__ import annotations

import pytest

from runtime import wire
from runtime.stages.common import StatsSender
from runtime.telemetry import RunTelemetry

KEY = b"k" * 32


class Capture:
    """Stands in for the telemetry PUSH socket: keeps what would be sent."""

    def __init__(self) -> None:
        self.sent: list[wire.Message] = []

    def send(self, frame, flags=0, copy=True):
        self._parts = [*getattr(self, "_parts", []), bytes(frame)]
        if not flags & 2:  # zmq.SNDMORE
            self.sent.append(wire.decode(self._parts))
            self._parts = []


def reports(source: str, *counts: int) -> tuple[StatsSender, list[wire.Message]]:
    sock = Capture()
    sender = StatsSender(sock, source, KEY)
    for c in counts:
        sender.send({"trained_steps": c})
    return sender, sock.sent


def test_signed_numbered_reports_are_taken_and_forged_or_replayed_ones_refused():
    tel = RunTelemetry(KEY)
    _, sent = reports("trainer-0.g0", 100, 200)
    tel.handle(sent[0])
    unsigned = wire.Message(
        wire.MsgType.STATS, {"src": "trainer-0.g0", "c": {"trained_steps": 10**12}}
    )
    with pytest.raises(wire.ProtocolError, match="without a valid signature"):
        tel.handle(unsigned)
    with pytest.raises(wire.ProtocolError, match="sent again"):
        tel.handle(sent[0])
    tel.handle(sent[1])
    with pytest.raises(wire.ProtocolError, match="sent again"):
        tel.handle(sent[0])
    _, other = reports("trainer-0.g0", 10**12)  # signed, but by another sender of that name
    with pytest.raises(wire.ProtocolError, match="another process"):
        tel.handle(other[0])
    assert tel.latest["trainer-0.g0"]["trained_steps"] == 200


def test_after_a_replacement_only_the_new_process_reports_under_the_name():
    tel = RunTelemetry(KEY)
    _, old = reports("compressor", 1, 2, 3)
    tel.handle(old[0])
    tel.handle(old[1])
    tel.replace("compressor")
    _, new = reports("compressor", 7)
    tel.handle(new[0])
    with pytest.raises(wire.ProtocolError, match="sent before it was replaced"):
        tel.handle(old[2])  # the dead one's report, read late
    sender = StatsSender(Capture(), "compressor", KEY)
    sender.inst = old[0].meta["inst"]  # one the dead one sent after it (it cannot: it is dead)
    sender.n = 9
    sender.send({"trained_steps": 10**12})
    with pytest.raises(wire.ProtocolError, match="no longer running"):
        tel.handle(sender.sock.sent[0])
    assert tel.latest["compressor"]["trained_steps"] == 7
    assert [c["trained_steps"] for c in tel.replaced["compressor"]] == [2]


def test_a_replaced_process_none_of_whose_reports_was_read_does_not_take_the_name():
    """A stage replaced again before its first report was read (the runner was busy restarting
    a trainer generation while it reported): its reports, read after the replacement, are
    refused, and the new process's are taken."""
    tel = RunTelemetry(KEY)
    _, first = reports("migrator", 1)
    tel.handle(first[0])
    tel.replace("migrator")
    _, unread = reports("migrator", 2, 3)  # the second process: none of its reports read yet
    tel.replace("migrator")
    _, third = reports("migrator", 4, 5)
    for late in unread:
        with pytest.raises(wire.ProtocolError, match="sent before it was replaced"):
            tel.handle(late)
    tel.handle(third[0])
    tel.handle(third[1])
    assert tel.latest["migrator"]["trained_steps"] == 5


def test_without_a_key_reports_are_taken_unchecked():
    tel = RunTelemetry()
    tel.handle(wire.Message(wire.MsgType.STATS, {"src": "actor-0.0", "c": {"stepped": 5}}))
    assert tel.latest["actor-0.0"] == {"stepped": 5}


def test_the_lead_trainer_is_the_one_that_reported_last():
    """After a GMI hand-over the retired trainer's last counters stay; figures such as the
    noise scale are read from the new one."""
    tel = RunTelemetry()
    assert tel.lead_trainer() == {}
    for src, noise in (("trainer-0.g0", 100.0), ("trainer-0.g1", 900.0)):
        tel.handle(wire.Message(wire.MsgType.STATS, {"src": src, "c": {"noise_scale": noise}}))
    assert tel.lead_trainer() == {"noise_scale": 900.0}
    assert tel.trainer_sources() == ["trainer-0.g0", "trainer-0.g1"]


def test_reports_carry_their_process_cpu_and_a_replaced_stage_keeps_its_seconds():
    _, sent = reports("migrator", 5)
    assert sent[0].meta["c"]["cpu_s"] >= 0  # the sender's process time, added to every report
    tel = RunTelemetry()
    tel.latest["migrator"] = {"cpu_s": 2.5}
    tel.replace("migrator")  # died; its successor counts from nothing
    tel.latest["migrator"] = {"cpu_s": 1.25}
    tel.latest["compressor"] = {"cpu_s": "bad"}
    assert tel.service_cpu_s() == {"compressor": 0.0, "migrator": 3.75}
    assert tel.total("migrator", "cpu_s") == 3


def test_a_stage_that_never_reports_is_stalled_after_its_start_allowance():
    """A migrator replaced and then stopped before its first report, and a compressor started
    that never reports, are reported stalled (so the supervisor can kill and replace them)
    once ``STALL_S + START_S`` have passed since they were to start; a process not announced
    (a trainer GMI) is watched only from its first report."""
    import time

    from runtime import telemetry

    tel = RunTelemetry(KEY)
    _, first = reports("migrator", 1)
    tel.handle(first[0])
    tel.replace("migrator")
    tel.expect("compressor")
    t0 = time.monotonic()
    allowed = telemetry.STALL_S + telemetry.START_S
    names = ["migrator", "compressor", "trainer-0.g0"]
    tel.watch(names, now=t0 + allowed - 1.0)
    assert tel.stall("migrator") is None and not tel.stalls
    tel.watch(names, now=t0 + allowed + 1.0)
    assert [s["process"] for s in tel.stalls] == ["migrator", "compressor"]
    assert tel.stalls[0]["silent_s"] >= allowed
    _, new = reports("migrator", 2)  # it reports after all: the stall ends
    tel.handle(new[0])
    tel.watch(["migrator"], now=time.monotonic() + 0.5)
    assert tel.stall("migrator") is None and tel.stall("compressor") is not None
