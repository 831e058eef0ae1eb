"""A job's registering again with the daemon (``DaemonLink`` on WHO): one HELLO awaits its
answer at a time, and after a refusal the job is not registered and asks again only after a
wait that doubles up to a cap, saying the daemon's reason once."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest

from autotune.control import job_link, protocol
from autotune.control.job_link import HELLO_RETRY_MAX_S, HELLO_RETRY_S, DaemonLink

WHO = {"type": protocol.MsgType.WHO}


@pytest.fixture
def link(monkeypatch):
    """A registered job's link on a clock the test moves (``link.now``); what it sends is
    recorded in ``link.sent`` (message types)."""
    now = [1000.0]
    monkeypatch.setattr(job_link, "time", SimpleNamespace(monotonic=lambda: now[0]))
    out = DaemonLink("ipc:///nonexistent/x.sock", {"base": {}}, object())
    sent: list[protocol.MsgType] = []
    monkeypatch.setattr(out, "_send", lambda kind, **body: sent.append(kind) or True)
    out.registered, out.registrations = True, 1
    out.now, out.sent = now, sent
    yield out
    out.registered = False  # no daemon to await a goodbye from (on a clock that stands still)
    out.close()


def _hellos(link) -> int:
    return link.sent.count(protocol.MsgType.HELLO)


def test_one_hello_awaits_its_answer_at_a_time(link):
    for _ in range(3):  # WHOs queued while the daemon was slow: one HELLO
        link._handle(WHO)
    assert _hellos(link) == 1
    link.now[0] += protocol.REQUEST_TIMEOUT_S / 2
    link._handle(WHO)
    assert _hellos(link) == 1
    link._handle({"type": protocol.MsgType.WELCOME, "job": link.job_id})
    assert link.registered and link.registrations == 2
    link.applied, link.budget_seq = 3, 2
    link._handle({"type": protocol.MsgType.WELCOME, "job": link.job_id, "again": True})
    assert (link.registrations, link.applied, link.budget_seq) == (2, 3, 2)  # the same one
    link._handle(WHO)  # answered: a WHO now asks again
    assert _hellos(link) == 2
    link.now[0] += protocol.REQUEST_TIMEOUT_S  # no answer in time: asked again
    link._handle(WHO)
    assert _hellos(link) == 3


def test_a_refused_hello_unregisters_the_job_and_backs_off_saying_why_once(link, caplog):
    reason = "cannot tune job x: the SQLite file /gone/s.db does not exist"
    waits = []
    with caplog.at_level(logging.DEBUG, logger=job_link.__name__):
        link._handle(WHO)
        for _ in range(9):
            link._handle({"type": protocol.MsgType.ERROR, "message": reason})
            assert not link.registered
            asked, waited = _hellos(link), 0.0
            while _hellos(link) == asked:  # a WHO for every report: a HELLO when the wait ends
                link.now[0] += 0.5
                waited += 0.5
                link._handle(WHO)
            waits.append(waited)
    assert waits == [1, 2, 4, 8, 16, 32, 60, 60, 60]
    assert waits[0] == HELLO_RETRY_S and waits[-1] == HELLO_RETRY_MAX_S
    said = [r for r in caplog.records if r.levelno >= logging.WARNING and reason in r.message]
    assert len(said) == 1 and "asking again in 1 s" in said[0].message
    link._handle({"type": protocol.MsgType.WELCOME, "job": link.job_id})
    assert link.registered and link.retry_s == HELLO_RETRY_S
    link._handle({"type": protocol.MsgType.ERROR, "message": "not an answer to a HELLO"})
    assert link.registered  # only an answer to its HELLO unregisters it


def test_a_job_that_gave_up_on_its_registration_says_goodbye(monkeypatch):
    """A HELLO the daemon read too late would register the job after all, and hold a budget
    for it until it counted as silent: the job that gave up says goodbye as it closes."""
    out = DaemonLink("ipc:///nonexistent/x.sock", {"base": {}}, object())
    sent: list[tuple[protocol.MsgType, dict]] = []
    monkeypatch.setattr(out, "_send", lambda kind, **body: sent.append((kind, body)) or True)
    out.hello_at = 0.0  # its HELLO went, and no WELCOME came in time
    assert out.close() is None
    assert sent == [(protocol.MsgType.BYE, {"job": out.job_id, "token": out.token})]
    quiet = DaemonLink("ipc:///nonexistent/y.sock", {"base": {}}, object())
    monkeypatch.setattr(quiet, "_send", lambda kind, **body: sent.append((kind, body)) or True)
    quiet.close()  # no daemon was there to ask: nothing to take back
    assert len(sent) == 1
