"""The migrator's receipts: the steps of each actor incarnation confirmed so far, published to
the actors (RECEIPT, ``runtime.receipts``).

A step is confirmed once a chunk holding it is handed to a trainer, or once the compressor gave
it up (``runtime.stages.settled``). The counts are cumulative and published at most every
``INTERVAL_S`` while they change and every ``REFRESH_S`` regardless, signed with the run's key.

An incarnation whose end of stream came names every step the compressor took of it
(``Settled.end``). Once the receipts confirm that many it has nothing more coming: it is
published ``KEEP_S`` longer (its actor, waiting at its exit, reads a refresh within
``REFRESH_S``), then left out. The receipts name the incarnations still running and those that
just ended, not every one the run has had. One that died without its end of stream stays named.
"""

from __future__ import annotations

import contextlib

import zmq

from runtime import wire
from runtime.stages import settled

INTERVAL_S = 0.005
REFRESH_S = 0.25
KEEP_S = 30.0
"""How long an incarnation is still named once all its steps are confirmed."""


class ReceiptBook:
    """Counts by actor incarnation (``"actor:inc"``) and their publication on ``sock``."""

    def __init__(self, sock: zmq.Socket | None, key: bytes = b"") -> None:
        self.sock, self.key = sock, key
        self.received: dict[str, int] = {}
        """Steps handed to a trainer."""
        self.settled: dict[str, int] = {}
        """Steps the compressor gave up on."""
        self.ended: dict[str, int] = {}
        """Incarnations whose end of stream came, with every step the compressor took."""
        self.done_at: dict[str, float] = {}
        """When an ended incarnation's steps were first all confirmed."""
        self.forgotten = 0
        self._changed = False
        self._sent = 0.0

    def handed(self, key: str, steps: int) -> None:
        """``steps`` of incarnation ``key`` went to a trainer."""
        self.received[key] = self.received.get(key, 0) + steps
        self._changed = True

    def take_settled(self, msg: wire.Message) -> None:
        """A SETTLED message (already checked for its signature).

        Raises:
            wire.ProtocolError: a malformed one (``settled.take``).
        """
        for key, steps in settled.take(self.settled, msg).items():
            self.ended[key] = max(self.ended.get(key, 0), steps)
        self._changed = True

    def counts(self, now: float) -> dict[str, int]:
        """What the receipts name now: each incarnation's confirmed steps, less those ended
        and confirmed whole more than ``KEEP_S`` ago (which are forgotten)."""
        counts = settled.confirmed(self.received, self.settled)
        for key, total in list(self.ended.items()):
            if counts.get(key, 0) < total:
                continue
            if now - self.done_at.setdefault(key, now) > KEEP_S:
                for book in (self.received, self.settled, self.ended, self.done_at):
                    book.pop(key, None)
                counts.pop(key, None)
                self.forgotten += 1
        return counts

    def publish(self, now: float) -> None:
        """Sends the receipts if they changed (at most every ``INTERVAL_S``) or every
        ``REFRESH_S``; a slow actor that misses one gets the next, newer counts."""
        if self.sock is None:
            return
        since = now - self._sent
        if (self._changed and since >= INTERVAL_S) or since >= REFRESH_S:
            with contextlib.suppress(zmq.Again):
                meta = {"received": self.counts(now)}
                if self.key:
                    meta = wire.sign(self.key, wire.MsgType.RECEIPT, meta)
                wire.send_msg(self.sock, wire.MsgType.RECEIPT, meta, flags=zmq.NOBLOCK)
            self._changed = False
            self._sent = now
