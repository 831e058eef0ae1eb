"""A trainer of a group, silent in the group's agreement while another member still collects
its batch, is not taken for stuck; once the member it waits for is silent too, both are."""

from __future__ import annotations

import multiprocessing as mp
import time

from runtime import supervisor as supervisor_module
from runtime import telemetry as telemetry_module
from runtime import wire
from runtime.services import Services
from runtime.supervisor import Supervisor
from runtime.telemetry import RunTelemetry


def report(tel: RunTelemetry, source: str, **counters) -> None:
    meta = {"src": source, "c": {"generation": 0, "trained_steps": 0, **counters}}
    tel.handle(wire.Message(wire.MsgType.STATS, meta))


def test_a_trainer_waiting_on_its_group_is_not_killed_while_the_member_it_waits_for_reports(
    monkeypatch,
):
    monkeypatch.setattr(supervisor_module, "STALL_KILL_S", 0.0)  # silent at all: stuck
    tel = RunTelemetry()
    services = Services(mp.get_context("spawn"))
    names = ("trainer-0.g0", "trainer-1.g0")
    for name in names:  # processes that use no CPU, as one blocked in a collective
        services.spawn(name, time.sleep, (600,))
    sup = Supervisor(services, None, tel, None, chunk_args=lambda: (0, 0.0))
    try:
        report(tel, names[0], group_wait=True)  # its batch is ready: it waits for rank 1
        report(tel, names[1])
        later = time.monotonic() + telemetry_module.STALL_S + 1.0
        tel.watch([names[0]], now=later)  # silent since, while rank 1 collects and reports
        assert tel.stall(names[0]) is not None and tel.stall(names[1]) is None
        sup._kill_stuck()
        assert all(proc.is_alive() for _, proc in services.items())
        tel.watch([names[1]], now=later)  # rank 1 silent too: stuck, and its peer with it
        sup._kill_stuck()
        assert not any(proc.is_alive() for _, proc in services.items())
        # a trainer not waiting on its group is killed when silent, as any process is
        services.spawn("trainer-0.g1", time.sleep, (600,))
        report(tel, "trainer-0.g1", generation=1)
        tel.watch(["trainer-0.g1"], now=later)
        sup._kill_stuck()
        assert not dict(services.items())["trainer-0.g1"].is_alive()
    finally:
        for _, proc in services.items():
            proc.kill()
            proc.join(timeout=5)
