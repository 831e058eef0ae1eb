"""A job's session token: the daemon takes a job's reports and goodbye, and a registration
that replaces its session, only with the token it registered with. Another client of the
control socket cannot speak for the job, end its tuning or drop its session; a HELLO without a
well-formed token is refused, saying what is expected."""

from __future__ import annotations

import dataclasses
import os

import zmq

from autotune.control import protocol
from autotune.control.daemon import Daemon
from autotune.control.machine import MachineView
from autotune.tuning.counters import Counters
from autotune.tuning.knobs import Machine, build_space, knobs_to_wire
from autotune.tuning.settings import TunerSettings


def _hello(home, job: str, token) -> dict:
    space = build_space(Machine(4, 0), ["batch_size=512,1024"], 4, 32, None)
    return {
        "job": job,
        "pid": os.getpid(),  # the sender's own, as the daemon checks on its ipc socket
        "token": token,
        "env": "CartPole-v1",
        "storage": f"sqlite:///{home / 'study.db'}",  # under the state dir: the daemon makes it
        "study": "tokens",
        "settings": dataclasses.asdict(TunerSettings(sampler="tpe")),
        "knobs": knobs_to_wire(space),
        "base": {k.name: k.choices[0] for k in space.values() if k.online},
    }


class Client:
    """One DEALER on the daemon's socket; ``ask`` has the in-process daemon read the message
    and returns its answer."""

    def __init__(self, ctx: zmq.Context, daemon: Daemon) -> None:
        self.sock, self.daemon = protocol.dealer(ctx, daemon.endpoint), daemon

    def ask(self, kind: protocol.MsgType, **body) -> dict:
        self.sock.send(protocol.encode(kind, **body))
        assert self.daemon.sock.poll(10_000), "the message did not reach the daemon"
        self.daemon._receive()
        while True:  # its answer, past the budgets and configs the daemon pushes
            assert self.sock.poll(10_000), "the daemon did not answer"
            msg = protocol.decode(self.sock.recv())
            if msg["type"] not in (protocol.MsgType.BUDGET, protocol.MsgType.APPLY):
                return msg


def test_only_the_jobs_own_token_reports_ends_or_registers_it_again(tmp_path, monkeypatch):
    home = tmp_path / "home"
    monkeypatch.setenv("AUTOTUNE_HOME", str(home))
    monkeypatch.setenv("AUTOTUNE_CONTROL", "")
    daemon = Daemon(protocol.resolve_endpoint(), machine=MachineView.from_dict({"cores": 4}))
    daemon.bind()
    ctx = zmq.Context()
    try:
        job, other = Client(ctx, daemon), Client(ctx, daemon)
        token, forged = protocol.new_token(), protocol.new_token()
        assert token != forged and protocol.token_problem(token) is None
        # no token, or not one: refused, the value never echoed
        for bad in (None, 7, "x" * 32, token.upper()):
            answer = job.ask(protocol.MsgType.HELLO, **_hello(home, "j1", bad))
            assert answer["type"] == "ERROR", answer
            assert "session token, 32 lowercase hex digits" in answer["message"]
            assert str(bad) not in answer["message"] or bad is None
        assert daemon.sessions == {}
        elsewhere = {**_hello(home, "j1", token), "pid": 1}  # for another process: refused
        answer = job.ask(protocol.MsgType.HELLO, **elsewhere)
        assert f"names pid 1, but process {os.getpid()} sent it" in answer["message"]
        welcome = job.ask(protocol.MsgType.HELLO, **_hello(home, "j1", token))
        assert welcome["type"] == "WELCOME", welcome
        session = daemon.sessions["j1"]
        identity = session.identity
        counters = Counters(
            t_s=1.0, trained_steps=100, lag_steps=0.0, gpu_j=0.0, cpu_j=1.0
        ).to_wire()
        report = {"job": "j1", "counters": counters, "applied": 0, "config": {"batch_size": 512}}
        # another client, with no token or a wrong one: refused, the session untouched
        for body in (report, {**report, "token": forged}):
            answer = other.ask(protocol.MsgType.REPORT, **body)
            assert answer["type"] == "ERROR" and "another session token" in answer["message"]
        assert session.remote.latest is None and session.identity == identity
        for body in ({"job": "j1"}, {"job": "j1", "token": forged}):
            answer = other.ask(protocol.MsgType.BYE, **body)
            assert answer["type"] == "ERROR", answer
        answer = other.ask(protocol.MsgType.HELLO, **_hello(home, "j1", forged))
        assert answer["type"] == "ERROR" and "another session token" in answer["message"]
        assert daemon.sessions["j1"] is session  # neither ended nor replaced
        # the job itself: its report is taken, and it may register again
        job.sock.send(protocol.encode(protocol.MsgType.REPORT, **report, token=token))
        assert daemon.sock.poll(10_000)
        daemon._receive()
        assert session.remote.latest.trained_steps == 100
        again = job.ask(protocol.MsgType.HELLO, **_hello(home, "j1", token))
        assert again["type"] == "WELCOME" and daemon.sessions["j1"] is not session
        farewell = job.ask(protocol.MsgType.BYE, job="j1", token=token)
        assert farewell["type"] == "FAREWELL" and daemon.sessions == {}
    finally:
        ctx.destroy(linger=0)
        for left in list(daemon.sessions.values()):
            daemon._drop(left, "test over")
        daemon.sock.close(linger=0)
        daemon.ctx.destroy(linger=0)
