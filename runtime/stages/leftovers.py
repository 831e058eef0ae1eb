"""What is left on the migrator's chunk input after the compressor's end of stream.

Only the compressor sends chunks, and it sends nothing after its end of stream: anything else
queued there came from elsewhere. It is read and counted as malformed, so that a foreign sender
shows in the migrator's report rather than going unseen.
"""

from __future__ import annotations

import time

import zmq

from runtime import wire

LEFTOVER_QUIET_MS = 50
LEFTOVER_MAX_S = 1.0
"""At most this long is spent on what is left on the chunk input after the end of stream (a
sender that never stops cannot hold the run's end back)."""


def count_leftovers(pull: zmq.Socket | None, key: bytes, malformed: wire.MalformedCounter) -> None:
    """Reads ``pull`` until it stays quiet ``LEFTOVER_QUIET_MS`` (for at most
    ``LEFTOVER_MAX_S``), counting every message on ``malformed``."""
    if pull is None:
        return
    deadline = time.monotonic() + LEFTOVER_MAX_S
    while time.monotonic() < deadline and pull.poll(LEFTOVER_QUIET_MS):
        while time.monotonic() < deadline:
            try:
                frames = pull.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                break
            try:
                msg = wire.decode(frames)
                if key:
                    wire.check_signed(key, msg)
                raise wire.ProtocolError(f"{msg.type.value} message after the end of stream")
            except wire.ProtocolError as exc:
                malformed.drop(exc)
