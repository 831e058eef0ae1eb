"""A run's tcp:// links: CURVE with keys made per run, a guard that admits only the run's client
key, refusals counted, and clear errors for a bad bind host."""

from __future__ import annotations

import pytest
import zmq
from conftest import wait_until

from runtime import topology, wire
from runtime.config import ConfigError, TrainConfig
from runtime.curve import RunKeys
from runtime.runner import Runner


def _received(sock: zmq.Socket, timeout_ms: int) -> list[wire.Message]:
    out = []
    while sock.poll(timeout_ms):
        out.append(wire.recv_msg(sock))
        timeout_ms = 0
    return out


def test_tcp_endpoints_carry_fresh_keys_that_are_never_printed():
    a, b = topology.Endpoints.tcp(), topology.Endpoints.tcp()
    assert a.keys is not None and b.keys is not None
    assert a.keys.server_secret != b.keys.server_secret  # made per run
    assert a.keys.client_public != b.keys.client_public
    for ep in (a, b):
        assert all(getattr(ep, name).startswith("tcp://127.0.0.1:") for name in topology._LINKS)
        for secret in (ep.keys.server_secret, ep.keys.client_secret):
            assert secret.decode() not in repr(ep) and secret.decode() not in repr(ep.keys)
    assert topology.Endpoints.inproc("x").keys is None


def _bindable(host: str) -> bool:
    import socket

    try:
        with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
            s.bind((host, 0))
    except OSError:
        return False
    return True


def _intruder(ctx: zmq.Context, server_public: bytes | None, address: str) -> zmq.Socket:
    """A PUSH connected to ``address`` with a CURVE key pair of its own, knowing the run's
    server key (``server_public``), or with no CURVE at all (None)."""
    sock = ctx.socket(zmq.PUSH)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.IPV6, 1)
    if server_public is not None:
        sock.curve_serverkey = server_public
        sock.curve_publickey, sock.curve_secretkey = zmq.curve_keypair()
    sock.connect(address)
    return sock


@pytest.mark.parametrize("host", ["127.0.0.1", "::1"])
def test_only_the_runs_own_key_gets_a_message_through_and_refusals_are_counted(host):
    """An intruder that even knows the server's public key, but offers its own client key, is
    refused by the guard and counted; one that speaks no CURVE fails the handshake. Neither's
    message reaches the bound socket; the run's own client's does (IPv4 and IPv6)."""
    if not _bindable(host):
        pytest.skip(f"{host} cannot be bound on this machine")
    ep = topology.Endpoints.tcp(host)
    ctx = zmq.Context()
    guard = topology.guard(ctx, ep)
    try:
        pull, _pub = topology.runner_sockets(ctx, ep)  # binds telemetry (PULL) and commands

        intruder = _intruder(ctx, ep.keys.server_public, ep.telemetry)
        plain = _intruder(ctx, None, ep.telemetry)
        for sock in (intruder, plain):
            # queued until a handshake that never completes: never delivered
            wire.send_msg(sock, wire.MsgType.STATS, {"src": "intruder", "c": {}}, flags=zmq.NOBLOCK)
        wait_until(lambda: guard.refused >= 1, what="the guard to refuse the intruder's key")

        own = topology.telemetry_out(ctx, ep)
        wire.send_msg(own, wire.MsgType.STATS, {"src": "own", "c": {}})
        got = _received(pull, timeout_ms=30_000)
        assert [m.meta["src"] for m in got] == ["own"]
        assert not _received(pull, timeout_ms=200)
    finally:
        guard.stop()
        ctx.destroy(linger=0)


def test_a_bind_host_that_is_not_an_ip_address_is_refused_saying_what_is_allowed():
    problems = TrainConfig(transport="tcp", bind_host="my-host").problems()
    assert any("bind_host='my-host'" in p and "IP address" in p for p in problems), problems
    assert not any("bind_host" in p for p in TrainConfig(bind_host="::1").problems())


def test_an_address_of_another_machine_cannot_be_bound_and_says_so():
    other = "198.51.100.7"  # TEST-NET-2: documentation only, no machine's own address
    with pytest.raises(ValueError, match=r"bind host '198\.51\.100\.7': cannot bind it here"):
        topology.Endpoints.tcp(other)
    with pytest.raises(ConfigError, match="cannot bind it here"):  # before any process starts
        TrainConfig(transport="tcp", bind_host=other).validate()


def test_a_runs_ports_are_held_outside_the_kernels_ephemeral_range_until_it_ends(monkeypatch):
    """A run's link ports come from below the ephemeral range (a taken one is skipped), and
    each is held from the choice to the run's end: its own processes bind there (ZeroMQ), a
    bind without SO_REUSEADDR cannot (Ray starts dozens of sockets between the choice and the
    migrator's bind)."""
    import socket

    from runtime import ports

    first = ports._ephemeral_from()
    chosen = [ports.free_port("127.0.0.1", hold=False) for _ in range(20)]
    if first - ports.PORTS_FROM >= 1000:
        assert all(ports.PORTS_FROM <= p < first for p in chosen), chosen
    ep = topology.Endpoints.tcp("127.0.0.1")
    port = int(ep.chunks.rsplit(":", 1)[1])
    with (
        pytest.raises(OSError),
        socket.socket() as other,
    ):  # held: a bind without SO_REUSEADDR is refused
        other.bind(("127.0.0.1", port))
    for _ in range(2):  # the run's own process binds it, and its replacement again
        ctx = zmq.Context()  # (destroyed: the listener closed before the next binds)
        try:
            ctx.socket(zmq.PULL).bind(ep.chunks)
        finally:
            ctx.destroy(linger=0)
    ep.release()
    with socket.socket() as other:  # the run ended: free
        other.bind(("127.0.0.1", port))
    with socket.socket() as taken:  # a taken port is skipped
        taken.bind(("127.0.0.1", chosen[0]))
        picks = iter([chosen[0]] + [chosen[1]] * 31)  # the first try is the taken port
        monkeypatch.setattr(ports.random.SystemRandom, "randrange", lambda *a: next(picks))
        monkeypatch.setattr(ports, "_ephemeral_from", lambda: 40_000)
        assert ports.free_port("127.0.0.1", hold=False) == chosen[1]


def test_run_keys_configure_server_and_client_sockets():
    keys = RunKeys.generate()
    ctx = zmq.Context()
    try:
        server, client = ctx.socket(zmq.PULL), ctx.socket(zmq.PUSH)
        keys.serve(server)
        keys.client(client)
        assert server.curve_server
        assert server.mechanism == client.mechanism == zmq.CURVE
    finally:
        ctx.destroy(linger=0)


@pytest.mark.slow
def test_a_run_over_tcp_with_an_intruder_on_its_experience_link_loses_nothing():
    """A whole run on tcp:// links: while it trains, a process with its own CURVE keys pushes
    forged rollouts at the compressor's experience link. The compressor's guard refuses it and
    the result counts it; nothing forged arrives (no malformed message anywhere), and every
    step sampled is trained."""
    cfg = TrainConfig(
        steps=6_000, actors=2, envs_per_actor=4, rollout_len=16, batch_size=512, transport="tcp"
    )
    ctx = zmq.Context()
    socks: list[zmq.Socket] = []
    runner: Runner

    def intrude(state) -> None:
        if socks or state.trained_steps < 512:
            return
        sock = _intruder(ctx, runner.endpoints.keys.server_public, runner.endpoints.experience)
        wire.send_msg(sock, wire.MsgType.STATS, {"src": "forged", "c": {}}, flags=zmq.NOBLOCK)
        socks.append(sock)

    runner = Runner(cfg, cfg.validate(), on_progress=intrude)
    try:
        result = runner.run()
    finally:
        ctx.destroy(linger=0)
    assert socks, "the run ended before the intruder connected"
    assert result["config"]["transport"] == "tcp"
    assert result["sampled_steps"] == result["env_steps"] + result["discarded_steps"]
    assert result["lost_steps"] == 0 and result["env_steps"] >= cfg.steps
    assert result["auth_refused"] >= 1
    assert sum(result["malformed"].values()) == 0


def test_a_run_whose_start_fails_gives_back_its_ports_and_stops_its_guard(monkeypatch):
    """A bind that fails before the run's loop (here the runner's own sockets) ends the run with
    its error, and nothing made before it stays: the held ports, the ZAP guard's thread, the
    ZeroMQ context."""
    import threading

    from runtime import ports

    def fail(ctx, ep):
        raise zmq.ZMQError(98, "Address already in use")

    monkeypatch.setattr(topology, "runner_sockets", fail)
    held, threads = set(ports._HELD), set(threading.enumerate())
    cfg = TrainConfig(env="CartPole-v1", steps=512, actors=1, batch_size=512, transport="tcp")
    with pytest.raises(zmq.ZMQError, match="Address already in use"):
        Runner(cfg, cfg.validate()).run()
    # every port it held is given back (a port another test of this process held before may
    # have been given back meanwhile: only what this run took is checked)
    assert set(ports._HELD) <= held
    wait_until(lambda: set(threading.enumerate()) <= threads, timeout_s=30, what="no new thread")
