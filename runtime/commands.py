"""The runner's COMMAND messages (drain, reset, retire, live settings, exit), signed and numbered.

The runner is their only sender: one PUB socket, bound once for the run. With the run's key
(``runtime.topology.Endpoints.run_key``) every command carries an HMAC of its type and header
(``wire.sign``) and a number ``n`` that goes up by one per command. A receiver takes a command
only with a valid signature and a number above the last it took, so a process that binds the
run's ``commands`` path again (ZeroMQ replaces an ``ipc://`` socket file), or a copy of a real
command sent again, reaches nobody: a forged reset epoch cannot starve a GMI generation of
chunks, and a copied ``drain`` or ``exit`` cannot end a stage early. A process started later takes
its first command whatever its number; what a copy of an older one could ask of it is already
held out where the command is read (a reset or live epoch at or below its own is ignored, and
``drain`` and ``exit`` are sent only once the run ends).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import zmq

from runtime import wire


class CommandOut:
    """The runner's COMMAND PUB: each command signed with the run's key (when there is one)
    and numbered."""

    def __init__(self, sock: zmq.Socket, key: bytes = b"") -> None:
        self.sock, self.key = sock, key
        self.n = 0
        """Commands sent so far: the next one's number."""

    def send(self, meta: dict[str, Any], flags: int = 0) -> None:
        """Sends one command (``meta`` holds its ``cmd`` and arguments)."""
        meta = {**meta, "n": self.n}
        if self.key:
            meta = wire.sign(self.key, wire.MsgType.COMMAND, meta)
        self.n += 1
        wire.send_msg(self.sock, wire.MsgType.COMMAND, meta, flags=flags)


class CommandIn:
    """A process's SUB for the runner's commands: yields only those the runner sent, each once."""

    def __init__(self, sock: zmq.Socket, key: bytes = b"") -> None:
        self.sock, self.key = sock, key
        self.last = -1
        """The number of the newest command taken (-1: none yet)."""

    def poll(self, timeout_ms: int = 0) -> bool:
        """Whether a message is waiting (after up to ``timeout_ms``)."""
        return bool(self.sock.poll(timeout_ms))

    def waiting(self, malformed: wire.MalformedCounter) -> Iterator[wire.Message]:
        """Every command waiting, in order (never blocks). What is not a command of this run
        (another type, a bad or missing signature, a number not above the last one taken) is
        dropped and counted in ``malformed``."""
        for msg in wire.recv_waiting(self.sock, malformed):
            try:
                yield self.check(msg)
            except wire.ProtocolError as exc:
                malformed.drop(exc)

    def check(self, msg: wire.Message) -> wire.Message:
        """``msg`` if it is a new command of this run.

        Raises:
            wire.ProtocolError: another type, a bad signature, or a number already taken.
        """
        if msg.type is not wire.MsgType.COMMAND:
            raise wire.ProtocolError(f"expected a command, got {msg.type.value}")
        if self.key:
            wire.check_signed(self.key, msg)
        n = wire.meta_int(msg.meta, "n")
        if n <= self.last:
            raise wire.ProtocolError(
                f"command {msg.meta.get('cmd')!r} number {n} was taken already "
                f"(newest taken: {self.last}): a copy sent again"
            )
        self.last = n
        return msg
