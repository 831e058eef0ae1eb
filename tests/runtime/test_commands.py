"""The runner's commands are signed and numbered: a process takes only those the runner sent,
each once; a forged or copied one is dropped and counted where it arrives."""

from __future__ import annotations

import threading
import time

import pytest
import zmq

from runtime import topology, wire
from runtime.commands import CommandIn, CommandOut
from runtime.stages.common import LiveSettings, exit_requested
from runtime.stages.compressor import Compressor

KEY = b"k" * 32


def _msg(meta: dict, key: bytes = KEY) -> wire.Message:
    meta = wire.sign(key, wire.MsgType.COMMAND, meta) if key else meta
    return wire.Message(wire.MsgType.COMMAND, meta)


@pytest.mark.parametrize(
    ("msg", "match"),
    [
        (_msg({"cmd": "exit", "n": 0}, key=b""), "without a valid signature"),
        (_msg({"cmd": "exit", "n": 0}, key=b"x" * 32), "without a valid signature"),
        (wire.Message(wire.MsgType.STATS, {"cmd": "exit", "n": 0}), "expected a command"),
        (_msg({"cmd": "exit"}), "'n' must be an integer"),
    ],
)
def test_a_command_not_signed_by_the_run_or_without_its_number_is_refused(msg, match):
    with pytest.raises(wire.ProtocolError, match=match):
        CommandIn(None, KEY).check(msg)


def test_a_copy_of_a_command_sent_again_is_refused_and_a_later_one_taken():
    commands = CommandIn(None, KEY)
    first = _msg({"cmd": "reset", "epoch": 1, "n": 4})
    assert commands.check(first) is first  # a process started later takes its first one
    with pytest.raises(wire.ProtocolError, match="number 4 was taken already"):
        commands.check(first)
    with pytest.raises(wire.ProtocolError, match="number 3 was taken already"):
        commands.check(_msg({"cmd": "reset", "epoch": 9, "n": 3}))
    assert commands.check(_msg({"cmd": "exit", "n": 5})).meta["cmd"] == "exit"


def _wired(ctx: zmq.Context, ep: topology.Endpoints) -> tuple[CommandOut, zmq.Socket, CommandIn]:
    """The runner's commands PUB, a forger's PUB, and a process's SUB that hears both (as a
    process that connects after a forger bound the run's path would)."""
    _, runner = topology.runner_sockets(ctx, ep)
    forger = ctx.socket(zmq.PUB)
    forger.bind(f"{ep.commands}-forger")
    heard = topology.command_in(ctx, ep)
    heard.sock.connect(f"{ep.commands}-forger")
    return runner, forger, heard


def _until_heard(sock: zmq.Socket, heard: CommandIn, meta: dict, seen) -> None:
    """Sends ``meta`` on ``sock`` until ``seen()`` (a SUB joins a PUB after a while)."""
    deadline = time.monotonic() + 60
    while not seen():
        assert time.monotonic() < deadline, f"{meta} never arrived"
        if isinstance(sock, CommandOut):
            sock.send(meta)
        else:
            wire.send_msg(sock, wire.MsgType.COMMAND, meta)
        time.sleep(0.01)


def test_a_forged_reset_epoch_never_reaches_a_trainer():
    ctx = zmq.Context()
    ep = topology.Endpoints.inproc("forged-reset")
    runner, forger, heard = _wired(ctx, ep)
    live, malformed = LiveSettings(), wire.MalformedCounter("test")

    def taken() -> bool:
        live.poll(heard, malformed)
        return malformed.count > 0

    _until_heard(forger, heard, {"cmd": "reset", "epoch": 50, "n": 10**9}, taken)
    assert live.reset_epoch == 0 and not live.reset_due
    _until_heard(
        runner,
        heard,
        {"cmd": "reset", "epoch": 1},
        lambda: bool(live.poll(heard, malformed) or live.reset_due),
    )
    assert live.reset_epoch == 1
    # the runner's own command, copied and sent again by another process, is refused
    copy = wire.sign(ep.run_key, wire.MsgType.COMMAND, {"cmd": "reset", "epoch": 2, "n": 0})
    before = malformed.count
    _until_heard(forger, heard, copy, lambda: taken() and malformed.count > before)
    assert live.reset_epoch == 1
    ctx.destroy(linger=0)


def test_a_forged_drain_or_exit_does_not_end_a_stage(tmp_path):
    ctx = zmq.Context()
    ep = topology.Endpoints.ipc(str(tmp_path))
    runner, forger, heard = _wired(ctx, ep)
    sink = ctx.socket(zmq.PULL)
    sink.bind(ep.chunks)
    pull, push, _ = topology.compressor_sockets(ctx, ep)
    compressor = Compressor(pull, push, heard, None, 1 << 16, 0.01, ep.run_key)
    thread = threading.Thread(target=compressor.run, daemon=True)
    thread.start()
    forged = {"cmd": "drain", "expect": {}, "n": 0}
    _until_heard(forger, heard, forged, lambda: compressor.malformed.count > 0)
    assert compressor.expect is None and thread.is_alive()
    _until_heard(runner, heard, {"cmd": "drain", "expect": {}}, lambda: not thread.is_alive())
    assert compressor.expect == {}
    # a drained stage waits for the runner's exit: a forged one is not it
    malformed = wire.MalformedCounter("test")
    wire.send_msg(forger, wire.MsgType.COMMAND, {"cmd": "exit", "n": 10**9})
    deadline = time.monotonic() + 60
    while malformed.count == 0:
        assert time.monotonic() < deadline
        assert not exit_requested(heard, malformed)
        wire.send_msg(forger, wire.MsgType.COMMAND, {"cmd": "exit", "n": 10**9})
        time.sleep(0.01)
    runner.send({"cmd": "exit"})
    while not exit_requested(heard, malformed):
        assert time.monotonic() < deadline
        runner.send({"cmd": "exit"})
        time.sleep(0.01)
    ctx.destroy(linger=0)
