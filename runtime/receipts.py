"""What an actor hears back from the migrator: RECEIPT messages, the steps of each actor
incarnation handed to a trainer so far (or given up by the pipeline, ``runtime.stages.settled``;
cumulative), which bound the actor's in-flight steps and let it exit only once everything it
sent is confirmed (``runtime.actor``). With the run's key, a receipt must be signed with it: a
forged one could let an actor exit before its steps were delivered. One sent again changes
nothing (the counts only go up)."""

from __future__ import annotations

import zmq

from runtime import wire


class Receipts:
    """The newest RECEIPT from the migrator: steps handed to a trainer, by actor incarnation."""

    def __init__(self, sock: zmq.Socket, key: str, run_key: bytes = b"") -> None:
        self.sock = sock
        self.key = key
        self.run_key = run_key
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
                if self.run_key:
                    wire.check_signed(self.run_key, msg)
                received = msg.meta.get("received")
                if not isinstance(received, dict):
                    raise wire.ProtocolError("'received' must be a map")
                if self.key in received:  # cumulative: never goes down
                    self.received = max(self.received, wire.meta_int(received, self.key))
            except wire.ProtocolError as exc:
                self.malformed.drop(exc)
        return self.received
