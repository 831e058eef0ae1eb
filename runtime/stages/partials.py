"""Rollouts the compressor holds while their channels arrive, and when it gives up on them.

An actor sends the channels of one rollout in order on one socket, so each actor incarnation has
at most one rollout partly received: the bytes held are bounded by the actors' count times one
rollout, and interleaved healthy rollouts are never evicted for their size. A rollout is evicted
(and counted as lost) when:

- it is still incomplete ``PARTIAL_MAX_AGE_S`` after its first channel (its actor died
  mid-send). The age counts only time the compressor could read its input: time blocked on the
  migrator's back-pressure is left out (``Partials.pause``), as the missing channels may be
  queued unread;
- more than ``PARTIAL_MAX_BYTES`` are held and its sender has begun a newer rollout (its missing
  channels were dropped on the way: they can no longer come);
- more than ``PARTIAL_CEILING_BYTES`` are held, oldest first, whatever the sender (the memory
  bound that holds even against senders that break the order above).
"""

from __future__ import annotations

import collections
from dataclasses import dataclass, field

import numpy as np

from runtime.frame_limits import ROLLOUT_MAX_BYTES

PARTIAL_MAX_AGE_S = 30.0
"""An incomplete rollout is evicted this long after its first channel arrived (an actor sends
all channels of a rollout at once)."""
PARTIAL_MAX_BYTES = ROLLOUT_MAX_BYTES
"""Past this many bytes held, a sender's older incomplete rollouts are evicted."""
PARTIAL_CEILING_BYTES = 16 * ROLLOUT_MAX_BYTES
"""Past this many bytes held, the oldest incomplete rollouts are evicted, whoever sent them."""


@dataclass
class Rollout:
    """One rollout of one actor incarnation, ``key`` = (actor, incarnation, seq)."""

    key: tuple[int, int, int]
    nch: int
    steps: int
    rows: int
    first_at: float
    channels: dict[int, tuple[str, np.ndarray]] = field(default_factory=dict)

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for _, a in self.channels.values())


class Partials:
    """The incomplete rollouts, oldest first, with their bytes and the count per sender."""

    def __init__(self) -> None:
        self.rollouts: dict[tuple[int, int, int], Rollout] = {}
        self.nbytes = 0
        self.per_sender: collections.Counter[tuple[int, int]] = collections.Counter()

    def begin(self, rollout: Rollout) -> None:
        self.rollouts[rollout.key] = rollout
        self.per_sender[rollout.key[:2]] += 1

    def add_channel(self, rollout: Rollout, ci: int, name: str, array: np.ndarray) -> None:
        rollout.channels[ci] = (name, array)
        self.nbytes += array.nbytes

    def pop(self, key: tuple[int, int, int]) -> Rollout:
        rollout = self.rollouts.pop(key)
        self.nbytes -= rollout.nbytes
        self.per_sender[key[:2]] -= 1
        if not self.per_sender[key[:2]]:
            del self.per_sender[key[:2]]
        return rollout

    def pause(self, seconds: float) -> None:
        """Leaves ``seconds`` the compressor could not read its input out of every age."""
        for rollout in self.rollouts.values():
            rollout.first_at += seconds

    def evict(self, now: float) -> list[tuple[Rollout, str]]:
        """Removes and returns the rollouts to give up on (see the module), each with why."""
        out = []
        for key, r in list(self.rollouts.items()):  # oldest first (insertion order)
            if now - r.first_at >= PARTIAL_MAX_AGE_S:
                why = f"still incomplete after {now - r.first_at:.0f} s"
            elif self.nbytes > PARTIAL_CEILING_BYTES:
                why = f"{self.nbytes} bytes held, above the ceiling of {PARTIAL_CEILING_BYTES}"
            elif self.nbytes > PARTIAL_MAX_BYTES and self.per_sender[key[:2]] > 1:
                why = "its sender began a newer rollout"
            else:
                continue
            out.append((self.pop(key), why))
        return out
