"""Who may talk to the daemon: a tcp:// control endpoint is served only with CURVE keys and an
allow-list (unauthenticated and unknown clients get nothing, and cannot stop it), and a path
that comes in a registration never makes the daemon create a file outside its state dir."""

from __future__ import annotations

import os
import socket
import stat
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import zmq
import zmq.auth
from conftest import kill_daemon

from autotune.control import protocol

CLI = [sys.executable, "-m", "autotune.cli"]


def _cli(env, *args, timeout=60):
    return subprocess.run([*CLI, *args], env=env, capture_output=True, text=True, timeout=timeout)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _ask(sock: zmq.Socket, kind: str, wait_ms: int = 1500) -> dict | None:
    """The daemon's answer, or None: none came, or the message could not even be handed over
    (a client the daemon refuses has no connection to send on, and a send would block)."""
    if not sock.poll(wait_ms, zmq.POLLOUT):
        return None
    try:
        sock.send(protocol.encode(kind), zmq.NOBLOCK)
    except zmq.Again:
        return None
    return protocol.decode(sock.recv()) if sock.poll(wait_ms) else None


def test_tcp_control_needs_curve_keys_and_admits_only_allowed_clients(tmp_path, monkeypatch):
    home = tmp_path / "h"
    env = {**os.environ, "AUTOTUNE_HOME": str(home), "AUTOTUNE_CONTROL": ""}
    env.pop("AUTOTUNE_KEYS", None)
    endpoint = f"tcp://127.0.0.1:{_free_port()}"

    refused = _cli(env, "daemon", "start", "--control", endpoint)
    assert refused.returncode == 2 and "run `autotune daemon keys`" in refused.stderr

    made = _cli(env, "daemon", "keys")
    assert made.returncode == 0 and "CURVE keys written" in made.stderr
    keys = home / "keys"
    assert stat.S_IMODE(keys.stat().st_mode) == 0o700
    assert stat.S_IMODE((keys / "server.key_secret").stat().st_mode) == 0o600
    secret = zmq.auth.load_certificate(str(keys / "client.key_secret"))[1]
    assert secret.decode() not in made.stderr + made.stdout  # never printed
    again = _cli(env, "daemon", "keys")
    assert "already" in again.stderr

    start = _cli(env, "daemon", "start", "--control", endpoint)
    assert start.returncode == 0, start.stderr
    pid = int(start.stderr.split("(pid ")[1].split(")")[0])
    ctx = zmq.Context()
    try:
        status = _cli(env, "status", "--control", endpoint)
        assert f"daemon {pid} on {endpoint}" in status.stdout, status.stdout + status.stderr

        plain = ctx.socket(zmq.DEALER)  # no CURVE at all
        plain.setsockopt(zmq.LINGER, 0)
        plain.connect(endpoint)
        stranger = ctx.socket(zmq.DEALER)  # CURVE, with a key pair not in the allow-list
        stranger.setsockopt(zmq.LINGER, 0)
        public, private = zmq.curve_keypair()
        stranger.curve_publickey, stranger.curve_secretkey = public, private
        stranger.curve_serverkey = zmq.auth.load_certificate(str(keys / "server.key"))[0]
        stranger.connect(endpoint)
        # each refused client waits its whole time for an answer; the two wait side by side
        with ThreadPoolExecutor(2) as pool:
            assert list(pool.map(lambda s: _ask(s, "STOP"), (plain, stranger))) == [None, None]
        os.kill(pid, 0)  # still running
        monkeypatch.setenv("AUTOTUNE_KEYS", str(keys))  # this process, as an allowed client
        assert protocol.request(endpoint, protocol.MsgType.PING)["pid"] == pid
    finally:
        ctx.destroy(linger=0)
        stop = _cli(env, "daemon", "stop", "--control", endpoint)
    assert stop.returncode == 0 and f"daemon {pid} stopped" in stop.stderr


def test_a_registration_cannot_make_the_daemon_create_a_file(tmp_path):
    home = tmp_path / "h"
    env = {**os.environ, "AUTOTUNE_HOME": str(home), "AUTOTUNE_CONTROL": ""}
    start = _cli(env, "daemon", "start")
    assert start.returncode == 0, start.stderr
    endpoint = f"ipc://{home / 'control.sock'}"
    target = tmp_path / "elsewhere" / "planted.db"
    target.parent.mkdir()
    link = tmp_path / "link.db"
    link.symlink_to(tmp_path / "victim.db")
    ctx = zmq.Context()
    try:
        sock = protocol.dealer(ctx, endpoint)
        answers = []
        for path in (target, link):
            hello = {"job": "forged", "pid": os.getpid(), "storage": f"sqlite:///{path}"}
            hello["env"] = "CartPole-v1"
            hello["study"] = "s"
            hello["token"] = protocol.new_token()
            sock.send(protocol.encode(protocol.MsgType.HELLO, **hello))
            assert sock.poll(5000), "the daemon did not answer"
            answers.append(protocol.decode(sock.recv()))
    finally:
        ctx.destroy(linger=0)
        kill_daemon(home)
    assert answers[0]["type"] == "ERROR" and "does not exist" in answers[0]["message"]
    assert "only under its state dir" in answers[0]["message"]
    assert answers[1]["type"] == "ERROR" and "not a regular file" in answers[1]["message"]
    assert not target.exists() and not (tmp_path / "victim.db").exists()
