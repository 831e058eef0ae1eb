"""Steps the compressor gave up on (rollouts it evicted incomplete), told to their actors
through the migrator's receipts.

An actor counts a step it sent as confirmed once a trainer got it or once the pipeline gave it
up: otherwise each evicted rollout would hold its share of the actor's in-flight budget for the
rest of the actor's life, and keep it waiting for receipts at its exit. The steps stay counted as
lost (the compressor's ``evicted_steps``); only the actor's wait ends.

The compressor sends SETTLED messages with the cumulative steps given up per actor incarnation
(``"actor:inc"``), signed with the run's key; the migrator keeps each count's maximum, so a copy
sent again changes nothing, and adds the counts to the receipts it publishes.

The same messages name the incarnations that ended (their end of stream came) since the last
one, each with every step the compressor took of it whole or in part (``ended``). Once the
receipts confirm that many, the incarnation has nothing more coming: the migrator names it in
its receipts a while longer (``runtime.stages.receipt_book``), then no more, so a long run that
starts new actors at every change does not send ever larger receipts.
"""

from __future__ import annotations

import re

import zmq

from runtime import wire

MAX_KEYS = 1 << 16
"""The most actor incarnations one SETTLED message may name."""
_KEY = re.compile(r"\d{1,9}:\d{1,9}")


class Settled:
    """The compressor's side: the steps given up per actor incarnation, and whether the
    migrator has yet to hear the newest counts."""

    def __init__(self) -> None:
        self.steps: dict[str, int] = {}
        self.ended: dict[str, int] = {}
        """Incarnations ended since the last message sent, with their steps taken."""
        self.due = False

    def add(self, actor: int, incarnation: int, steps: int) -> None:
        key = f"{actor}:{incarnation}"
        self.steps[key] = self.steps.get(key, 0) + int(steps)
        self.due = True

    def end(self, actor: int, incarnation: int, steps: int) -> None:
        """The incarnation's end of stream came: ``steps`` is all the compressor took of it."""
        self.ended[f"{actor}:{incarnation}"] = int(steps)
        self.due = True

    def send(self, push: zmq.Socket, key: bytes) -> None:
        """Sends the counts where new ones are due; where the migrator pushes back, a later
        call sends them (they are cumulative: nothing is lost by waiting)."""
        if not self.due:
            return
        meta = {"settled": dict(self.steps), "ended": dict(self.ended)}
        if key:
            meta = wire.sign(key, wire.MsgType.SETTLED, meta)
        try:
            wire.send_msg(push, wire.MsgType.SETTLED, meta, flags=zmq.NOBLOCK)
        except zmq.Again:
            return
        self.due, self.ended = False, {}


def take(counts: dict[str, int], msg: wire.Message) -> dict[str, int]:
    """The migrator's side: folds a SETTLED message into ``counts`` (the maximum of each);
    returns the incarnations it names as ended, with their steps.

    Raises:
        wire.ProtocolError: ``settled`` or ``ended`` is not a map of at most ``MAX_KEYS``
            ``"actor:inc"`` keys to non-negative integers.
    """
    values = _counts(msg.meta, "settled")
    ended = _counts(msg.meta, "ended") if "ended" in msg.meta else {}
    for name, steps in values.items():
        counts[name] = max(counts.get(name, 0), steps)
    return ended


def _counts(meta: dict, field: str) -> dict[str, int]:
    given = meta.get(field)
    if not isinstance(given, dict) or len(given) > MAX_KEYS:
        raise wire.ProtocolError(f"SETTLED {field!r} needs a map of at most {MAX_KEYS} entries")
    values = {}
    for name in given:
        if not isinstance(name, str) or not _KEY.fullmatch(name):
            raise wire.ProtocolError(f"SETTLED key {name!r:.40}: allowed 'actor:incarnation'")
        values[name] = wire.meta_int(given, name)
        if values[name] < 0:
            raise wire.ProtocolError(f"SETTLED steps of {name} must be 0 or more")
    return values


def confirmed(received: dict[str, int], settled: dict[str, int]) -> dict[str, int]:
    """Each incarnation's steps confirmed: handed to a trainer, or given up by the pipeline."""
    return {k: received.get(k, 0) + settled.get(k, 0) for k in received.keys() | settled.keys()}
