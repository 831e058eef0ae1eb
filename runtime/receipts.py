"""What an actor hears back from the migrator: RECEIPT messages, the steps of each actor
incarnation handed to a trainer so far (cumulative), which bound the actor's in-flight steps
and let it exit only once everything it sent is confirmed (``runtime.actor``)."""

from __future__ import annotations

import zmq

from runtime import wire


class Receipts:
    """The newest RECEIPT from the migrator: steps handed to a trainer, by actor incarnation."""

    def __init__(self, sock: zmq.Socket, key: str) -> None:
        self.sock = sock
        self.key = key
        self.received = 0
        self.malformed = wire.MalformedCounter("actor-receipts")

    def poll(self, timeout_ms: int = 0) -> int:
        """Takes every waiting receipt; returns this incarnation's confirmed steps."""
        if not self.sock.poll(timeout_ms):
            return self.received
        for msg in wire.recv_waiting(self.sock, self.malformed):
            try:
                if msg.type is not wire.MsgType.RECEIPT:
                    raise wire.ProtocolError(f"expected receipts, got {msg.type.value}")
                received = msg.meta.get("received")
                if not isinstance(received, dict):
                    raise wire.ProtocolError("'received' must be a map")
                if self.key in received:  # cumulative: never goes down
                    self.received = max(self.received, wire.meta_int(received, self.key))
            except wire.ProtocolError as exc:
                self.malformed.drop(exc)
        return self.received
