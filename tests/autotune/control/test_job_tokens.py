"""A job's session token: the daemon takes a job's reports and goodbye, and a registration
that replaces its session, only with the token it registered with. Another client of the
control socket cannot speak for the job, end its tuning or drop its session; a HELLO without a
well-formed token is refused, saying what is expected."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import socket

import zmq
import zmq.auth
from conftest import mujoco_like_model

from autotune.control import protocol
from autotune.control.daemon import Daemon
from autotune.control.keys import generate
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

    def __init__(self, ctx: zmq.Context, daemon: Daemon, sock: zmq.Socket | None = None) -> None:
        self.sock, self.daemon = sock or protocol.dealer(ctx, daemon.endpoint), daemon

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
    with _serving(tmp_path, monkeypatch) as (home, daemon, ctx):
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
        # the job itself: its report is taken, and a HELLO it sends again keeps its session
        job.sock.send(protocol.encode(protocol.MsgType.REPORT, **report, token=token))
        assert daemon.sock.poll(10_000)
        daemon._receive()
        assert session.remote.latest.trained_steps == 100
        again = job.ask(protocol.MsgType.HELLO, **_hello(home, "j1", token))
        assert again["type"] == "WELCOME" and daemon.sessions["j1"] is session
        farewell = job.ask(protocol.MsgType.BYE, job="j1", token=token)
        assert farewell["type"] == "FAREWELL" and daemon.sessions == {}


def two_jobs(home, daemon: Daemon, ctx: zmq.Context) -> tuple[Client, Client, str]:
    """Jobs j1 and j2 registered, each from its own client; the clients and j1's token."""
    job, other = Client(ctx, daemon), Client(ctx, daemon)
    token = protocol.new_token()
    assert job.ask(protocol.MsgType.HELLO, **_hello(home, "j1", token))["type"] == "WELCOME"
    second = {**_hello(home, "j2", protocol.new_token()), "study": "other"}
    assert other.ask(protocol.MsgType.HELLO, **second)["type"] == "WELCOME"
    return job, other, token


@contextlib.contextmanager
def _serving(tmp_path, monkeypatch, endpoint: str | None = None):
    """An in-process daemon of a 4-core machine with a state dir under ``tmp_path`` (on
    ``endpoint``, its own ipc:// socket by default), and a context for its clients; the state
    dir, the daemon and the context."""
    home = tmp_path / "home"
    monkeypatch.setenv("AUTOTUNE_HOME", str(home))
    monkeypatch.setenv("AUTOTUNE_CONTROL", "")
    endpoint = endpoint or protocol.resolve_endpoint()
    daemon = Daemon(endpoint, machine=MachineView.from_dict({"cores": 4}))
    daemon.bind()
    # a described machine: this one's load (other tests, a CI run) is not its foreign load
    daemon.shares.read_foreign = False
    daemon.shares.foreign = {"cores": 0, "pinned": [], "gpus": [], "pids": []}
    ctx = zmq.Context()
    try:
        yield home, daemon, ctx
    finally:
        ctx.destroy(linger=0)
        for left in list(daemon.sessions.values()):
            daemon._drop(left, "test over")
        daemon.sock.close(linger=0)
        if daemon.auth is not None:
            daemon.auth.stop()
        daemon.ctx.destroy(linger=0)
        daemon.lock.close()


def test_a_hello_the_registered_job_sends_again_keeps_its_registration(tmp_path, monkeypatch):
    """A job sends a HELLO per WHO, and WHOs queue while the daemon is slow: a HELLO from the
    registered job itself (its token, pid and socket) is answered WELCOME again, with its
    budget; its trial is not failed and no job's budget moves."""
    with _serving(tmp_path, monkeypatch) as (home, daemon, ctx):
        job, _other, token = two_jobs(home, daemon, ctx)
        session = daemon.sessions["j1"]
        closed: list[str] = []
        monkeypatch.setattr(session.tuner, "close", closed.append)
        before = {j: (s.budget, s.seq) for j, s in daemon.shares.shares.items()}
        again = job.ask(protocol.MsgType.HELLO, **_hello(home, "j1", token))
        assert again["type"] == "WELCOME" and again["job"] == "j1" and again["again"] is True
        assert daemon.sessions["j1"] is session and closed == []
        assert {j: (s.budget, s.seq) for j, s in daemon.shares.shares.items()} == before
        assert job.sock.poll(10_000), "its budget was not sent again"
        budget = protocol.decode(job.sock.recv())
        assert budget["type"] == "BUDGET" and budget["seq"] == before["j1"][1]
        assert budget["budget"] == before["j1"][0].to_dict()


def test_a_malformed_machine_model_and_an_offer_that_fails_are_answered_with_an_error(
    tmp_path, monkeypatch
):
    """A HELLO whose machine model has a field of the wrong type is refused, naming it (a
    model that fails later would stop the share-out of every job); an OFFER that fails in any
    way is answered ERROR, and the daemon goes on answering."""
    with _serving(tmp_path, monkeypatch) as (home, daemon, ctx):
        job = Client(ctx, daemon)
        model = {**dataclasses.asdict(mujoco_like_model()), "t_env": "x"}
        hello = {**_hello(home, "j1", protocol.new_token()), "machine": model}
        answer = job.ask(protocol.MsgType.HELLO, **hello)
        assert answer["type"] == "ERROR", answer
        assert "machine model: t_env='x'; allowed: a finite number >= 0" in answer["message"]
        assert daemon.sessions == {} and daemon.shares.shares == {}

        def failing(claim, pid=None):
            raise TypeError("'<' not supported between instances of 'str' and 'int'")

        monkeypatch.setattr(daemon.shares, "offer", failing)
        answer = job.ask(protocol.MsgType.OFFER, claim={}, pid=os.getpid())
        assert answer["type"] == "ERROR", answer
        assert "no offer for the claim {}: TypeError: '<' not supported" in answer["message"]
        assert "a claim is a map of weight, min_share" in answer["message"]
        assert job.ask(protocol.MsgType.PING)["type"] == "PONG"


def test_on_tcp_an_offer_pending_from_one_client_key_is_not_replaced_or_taken_by_another(
    tmp_path, monkeypatch
):
    """On a tcp:// control socket the daemon cannot check the pid a message names, so an
    OFFER or a HELLO for a pid whose offer is pending from another allow-listed client key is
    refused: the offer stays as it was, and its own client registers with it."""
    monkeypatch.delenv("AUTOTUNE_KEYS", raising=False)
    monkeypatch.setenv("AUTOTUNE_HOME", str(tmp_path / "home"))
    keys, _ = generate()
    public, secret = zmq.auth.create_certificates(str(tmp_path), "other")  # a second client
    shutil.copyfile(public, keys / "authorized" / "other.key")
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        endpoint = f"tcp://127.0.0.1:{free.getsockname()[1]}"
    with _serving(tmp_path, monkeypatch, endpoint) as (home, daemon, ctx):
        job = Client(ctx, daemon)  # the client pair of the keys dir
        other_sock = ctx.socket(zmq.DEALER)
        other_sock.setsockopt(zmq.LINGER, 0)
        other_sock.curve_publickey, other_sock.curve_secretkey = zmq.auth.load_certificate(secret)
        other_sock.curve_serverkey = zmq.auth.load_certificate(str(keys / "server.key"))[0]
        other_sock.connect(endpoint)
        other = Client(ctx, daemon, other_sock)
        pid = os.getpid()
        offer = job.ask(protocol.MsgType.OFFER, claim={}, pid=pid)
        assert offer["type"] == "OFFER", offer
        held = daemon.shares.shares[f"offer-{pid}"]
        pending = f"process {pid} has an offer pending from another client key"
        answer = other.ask(protocol.MsgType.OFFER, claim={"weight": 2.0}, pid=pid)
        assert answer["type"] == "ERROR" and pending in answer["message"], answer
        assert daemon.shares.shares[f"offer-{pid}"] is held  # not replaced
        answer = other.ask(protocol.MsgType.HELLO, **_hello(home, "taker", protocol.new_token()))
        assert answer["type"] == "ERROR" and pending in answer["message"], answer
        assert daemon.sessions == {}
        # another pid is its own to offer for; the offer's own client registers with its
        answer = other.ask(protocol.MsgType.OFFER, claim={}, pid=os.getppid())
        assert answer["type"] == "OFFER", answer
        welcome = job.ask(protocol.MsgType.HELLO, **_hello(home, "j1", protocol.new_token()))
        assert welcome["type"] == "WELCOME", welcome
        assert f"offer-{pid}" not in daemon.shares.shares
        # the offer taken, the pid's next offer may come from either client
        answer = other.ask(protocol.MsgType.OFFER, claim={}, pid=pid)
        assert answer["type"] == "OFFER", answer
