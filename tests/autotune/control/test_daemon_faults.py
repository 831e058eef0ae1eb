"""The daemon under a bad message, a broken study or a failing tuner: each is answered or shown
as what it is, and the other jobs, the status and the daemon's tick go on."""

from __future__ import annotations

import json
import math
import socket
import threading

import pytest
from test_job_tokens import Client, _hello, _serving, two_jobs

from autotune.cli.output import json_safe
from autotune.control import daemon as daemon_module
from autotune.control import protocol
from autotune.control.admission import storage_problem, study_problem
from autotune.control.allocator import Budget
from autotune.control.claims import Share, apart, claim_from
from autotune.tuning.counters import Counters
from autotune.tuning.storage import StudyError, open_study, storage_url


def _counters(t: float, steps: int) -> dict:
    return Counters(t_s=t, trained_steps=steps, lag_steps=0.0, gpu_j=t, cpu_j=t).to_wire()


def test_a_message_that_fails_neither_ends_the_daemon_nor_stops_its_tick(tmp_path, monkeypatch):
    """Every message read fails: the daemon still ticks after every batch it reads, and a
    batch holds two messages at most here (how many are queued when it reads depends on the
    machine's load, so the cap is what is checked, not the batches' sizes)."""
    sent = 20
    with _serving(tmp_path, monkeypatch) as (_home, daemon, ctx):
        client = Client(ctx, daemon)
        for _ in range(sent):
            client.sock.send(protocol.encode(protocol.MsgType.PING))
        received, ticks = [], []

        def failing() -> None:
            daemon.sock.recv_multipart()
            received.append(1)
            raise ValueError("embedded null byte")

        def tick() -> None:
            ticks.append(len(received))
            daemon.stopping = len(received) >= sent

        monkeypatch.setattr(daemon, "_receive", failing)
        monkeypatch.setattr(daemon, "_tick", tick)
        monkeypatch.setattr(daemon_module.signal, "signal", lambda *args: None)
        monkeypatch.setattr(daemon_module, "MAX_PER_TICK", 2)
        daemon.serve()
        assert len(received) == sent and ticks[-1] == sent
        batches = [b - a for a, b in zip([0, *ticks], ticks, strict=False)]
        assert max(batches) <= 2, batches  # a tick after every batch of two at most
        assert sum(1 for b in batches if b) >= sent // 2


def test_a_bad_storage_or_env_is_refused_and_one_study_is_one_study_by_any_url(tmp_path):
    assert "NUL byte" in storage_problem(f"sqlite:///{tmp_path}/a\0b.db")
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "link").symlink_to(real)
    hellos = {"j1": {"storage": f"sqlite:///{real}/study.db", "study": "s", "pid": 7}}
    for alias in (
        f"sqlite:///{real}//study.db",
        f"sqlite:///{tmp_path}/link/study.db",
        f"sqlite+pysqlite:///{real}/study.db",
    ):
        why = study_problem({"env": "CartPole-v1", "storage": alias, "study": "s"}, hellos)
        assert why is not None and "is being tuned for job j1" in why, alias
    other = {"env": "CartPole-v1", "storage": f"sqlite:///{real}/other.db", "study": "s"}
    assert study_problem(other, hellos) is None
    assert "env must be an environment id" in study_problem({**other, "env": b"x"}, hellos)


def test_held_budgets_kept_after_a_restart_keep_a_gpu_within_its_100_percent():
    """After a daemon restart each job keeps the budget it holds only where no core is in two
    budgets and its GPU's shares add up to 100 % at most."""

    def share(job: str, cores: tuple[int, ...], pct: int) -> Share:
        return Share(claim_from(job, {}), budget=Budget(cores, gpu=0, mps_pct=pct))

    first = share("a", (0, 1), 100)
    assert not apart(share("b", (2, 3), 100), {"a": first})
    assert apart(share("b", (2, 3), 0), {"a": share("a", (0, 1), 100)})
    assert apart(share("b", (2, 3), 40), {"a": share("a", (0, 1), 60)})
    assert not apart(share("b", (1, 3), 10), {"a": share("a", (0, 1), 60)})


def test_status_shows_every_job_when_one_study_breaks_and_never_infinite_rates(
    tmp_path, monkeypatch
):
    """Job j2's storage file is overwritten: status still answers, j1 whole and j2 with its
    allocation and the error; a report's map keys that are not text are left out; two reports
    a hair apart give no rates rather than infinite ones."""
    with _serving(tmp_path, monkeypatch) as (home, daemon, ctx):
        one, two = Client(ctx, daemon), Client(ctx, daemon)
        token = protocol.new_token()
        assert one.ask(protocol.MsgType.HELLO, **_hello(home, "j1", token))["type"] == "WELCOME"
        hello = {**_hello(home, "j2", protocol.new_token()), "study": "other"}
        hello["storage"] = f"sqlite:///{home / 'other.db'}"
        assert two.ask(protocol.MsgType.HELLO, **hello)["type"] == "WELCOME"
        from sqlalchemy.exc import OperationalError

        def unreadable():
            raise OperationalError("SELECT", {}, Exception("database disk image is malformed"))

        monkeypatch.setattr(daemon.sessions["j2"].tuner, "best", unreadable)
        status = two.ask(protocol.MsgType.STATUS)["status"]
        jobs = {j["id"]: j for j in status["jobs"]}
        assert set(jobs) == {"j1", "j2"} and "error" not in jobs["j1"]
        assert "database disk image is malformed" in jobs["j2"]["error"]
        assert jobs["j2"]["allocation"]["cores"] and jobs["j2"]["env"] == "CartPole-v1"
        report = {"job": "j1", "token": token, "applied": 0}
        report["config"] = {"batch_size": {b"k": 1}}  # what a job sends: not checked deeper
        for t, steps in ((1.0, 0), (1.0 + 1e-320, 9)):  # a hair apart
            counters = Counters(t_s=t, trained_steps=steps, lag_steps=0.0, gpu_j=t, cpu_j=t)
            one.sock.send(
                protocol.encode(protocol.MsgType.REPORT, counters=counters.to_wire(), **report)
            )
        for _ in range(2):
            assert daemon.sock.poll(10_000)
            daemon._receive()
        status = two.ask(protocol.MsgType.STATUS)["status"]
        (first,) = [j for j in status["jobs"] if j["id"] == "j1"]
        assert first["live"] is None and first["steps_per_s"] is None
        with pytest.raises(TypeError, match="keys must be"):
            json.dumps(status, default=str)
        doc = json.loads(json.dumps(json_safe(status), allow_nan=False, default=str))
        assert [j["config"] for j in doc["jobs"] if j["id"] == "j1"] == [
            {"batch_size": {"b'k'": 1}}
        ]
        assert json_safe({"r": [math.inf, math.nan, 1.5]}) == {"r": [None, None, 1.5]}


def test_a_job_whose_tuner_failed_is_refused_for_a_while_and_the_others_keep_their_budgets(
    tmp_path, monkeypatch
):
    with _serving(tmp_path, monkeypatch) as (home, daemon, ctx):
        job, _other, token = two_jobs(home, daemon, ctx)
        session = daemon.sessions["j1"]

        def broken() -> None:
            raise OSError("disk full")

        monkeypatch.setattr(session.tuner, "tick", broken)
        report = {"job": "j1", "token": token, "applied": 0, "config": {"batch_size": 512}}
        job.sock.send(
            protocol.encode(protocol.MsgType.REPORT, counters=_counters(1.0, 1), **report)
        )
        assert daemon.sock.poll(10_000)
        daemon._receive()
        daemon._tick()
        assert "j1" not in daemon.sessions
        seq = daemon.shares.shares["j2"].seq
        again = job.ask(protocol.MsgType.HELLO, **_hello(home, "j1", token))
        assert again["type"] == "ERROR" and "its tuning failed (OSError)" in again["message"]
        assert daemon.shares.shares["j2"].seq == seq  # no churn of the others' budgets
        daemon.failed["j1"] = (0.0, "OSError")  # the hold over
        assert job.ask(protocol.MsgType.HELLO, **_hello(home, "j1", token))["type"] == "WELCOME"


def test_a_database_server_that_never_answers_fails_the_open_instead_of_hanging():
    assert storage_url("postgresql://u@h/db").endswith("/db?connect_timeout=10")
    assert storage_url("mysql+pymysql://u@h/db?charset=utf8").endswith("&connect_timeout=10")
    assert storage_url("postgresql://u@h/db?connect_timeout=3").endswith("?connect_timeout=3")
    pytest.importorskip("psycopg")
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        taken = []
        threading.Thread(target=lambda: taken.append(silent.accept()), daemon=True).start()
        url = f"postgresql://u:p@127.0.0.1:{silent.getsockname()[1]}/db?connect_timeout=1"
        with pytest.raises(StudyError, match="cannot open study 's'"):
            open_study(url, "s")
