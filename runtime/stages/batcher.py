"""Batcher (in each trainer): reassembles chunks and slices or stacks them into training batches.

Chunk channels arrive one message each; a chunk is usable once all its channels are in. Rows
(one trajectory of one environment) are then queued, and a batch takes exactly ``batch_rows``
rows: slicing a chunk larger than a batch, stacking several smaller ones. Stale rows (policy
lag above the learner's limit) are removed from a batch and counted as discarded.

The steps received from each actor incarnation are counted here too (the actors throttle on the
migrator's receipts; see ``runtime.stages.migrator``).

Credits: the batcher tells the migrator how many more chunks it can take. It starts with
``window_chunks`` and returns a slot when a chunk is complete, unless two batches are already
queued, in which case the slot is returned after the next batch is taken. Memory is bounded by
two batches plus the window.

A migrator started in place of a dead one is granted the window again (``Batcher.reset``). The
chunks the dead one had sent that arrive afterwards hold slots of that old grant: they are
queued and counted as usual but return no slot, else every replacement would widen the window.
They are known by their id: the new migrator's first message (FIRST_CHUNK) says the lowest id
it routes, and whatever comes after a reset and before it is the old migrator's.
"""

from __future__ import annotations

import collections
import logging
from dataclasses import dataclass, field

import numpy as np

from runtime import wire
from runtime.stages.dispenser import layout_problem

logger = logging.getLogger(__name__)


@dataclass
class _Chunk:
    nch: int
    steps: int
    rows: int
    rollouts: list[list[int]]
    stale: bool = False
    """Sent by a migrator replaced since: its slot was granted again at the reset."""
    channels: dict[int, tuple[str, np.ndarray]] = field(default_factory=dict)


@dataclass(frozen=True)
class Taken:
    """One batch (channel name -> array of ``rows`` rows) and what was left out of it."""

    batch: dict[str, np.ndarray]
    rows: int
    steps: int
    discarded_rows: int
    discarded_steps: int


EVICTED_KEPT = 1024
"""How many dropped chunk ids a batcher remembers."""


class Batcher:
    """Chunk reassembly, the row queue, and the credit window of one trainer.

    Args:
        batch_rows: Rows (trajectories) per training batch.
        window_chunks: Chunks the migrator may have in flight to this trainer at start.
    """

    QUEUE_BATCHES = 2
    """Credits are held back while this many whole batches are queued (bounds the lag)."""

    def __init__(self, batch_rows: int, window_chunks: int = 4) -> None:
        if batch_rows < 1 or window_chunks < 1:
            raise ValueError(f"batch_rows={batch_rows}, window_chunks={window_chunks}: need >= 1")
        self.batch_rows = batch_rows
        self.window_chunks = window_chunks
        self.partial: dict[int, _Chunk] = {}
        self.blocks: collections.deque[dict[str, np.ndarray]] = collections.deque()
        self.queued_rows = 0
        self.queued_steps = 0
        self.owed_credits = 0
        self._grant = window_chunks
        self.floor = 0
        """The lowest chunk id the current migrator routes (FIRST_CHUNK)."""
        self.floor_due = False
        """A reset was taken and the new migrator's FIRST_CHUNK has not come yet."""
        self.dropped_steps = 0
        """Steps of chunks rejected or left incomplete (counted as discarded by the trainer)."""
        self.received_steps: dict[str, int] = {}
        """Steps received whole, by actor incarnation ``"actor:inc"``."""
        self.counters = dict.fromkeys(
            ("messages", "bytes", "chunks", "batches", "late_channels", "stale_chunks"), 0
        )
        self.evicted: collections.deque[int] = collections.deque(maxlen=EVICTED_KEPT)
        """Ids of chunks dropped incomplete: a channel of one that comes late (after a reset,
        from the replaced migrator) is ignored, not taken as a new chunk and dropped twice."""

    def add(self, msg: wire.Message) -> bool:
        """Takes one CHUNK channel message (or the migrator's FIRST_CHUNK); returns True when it
        completed its chunk.

        Raises:
            wire.ProtocolError: Not a chunk channel, or one that conflicts with its chunk.
        """
        if msg.type is wire.MsgType.FIRST_CHUNK:
            self.floor, self.floor_due = wire.meta_int(msg.meta, "chunk"), False
            return False
        if msg.type is not wire.MsgType.CHUNK or len(msg.arrays) != 1:
            raise wire.ProtocolError(f"batcher expects one-array chunk messages, got {msg.type}")
        m = msg.meta
        chunk_id, ci, nch = (
            wire.meta_int(m, "chunk"),
            wire.meta_int(m, "ci"),
            wire.meta_int(m, "nch"),
        )
        steps, rows, name = wire.meta_int(m, "steps"), wire.meta_int(m, "rows"), str(m.get("ch"))
        array = msg.arrays[0]
        if array.ndim < 2 or array.shape[0] != rows or not 0 <= ci < nch:
            raise wire.ProtocolError(f"chunk {chunk_id} channel {name!r} has a bad layout")
        rollouts = wire.meta_rollouts(m)
        if chunk_id in self.evicted:
            self.counters["late_channels"] += 1  # its chunk was dropped (and counted) already
            return False
        stale = self.floor_due or chunk_id < self.floor
        chunk = self.partial.setdefault(chunk_id, _Chunk(nch, steps, rows, rollouts, stale))
        if ci in chunk.channels or (chunk.nch, chunk.rows) != (nch, rows):
            raise wire.ProtocolError(f"chunk {chunk_id} channel {name!r} conflicts with its chunk")
        chunk.channels[ci] = (name, array)
        self.counters["messages"] += 1
        self.counters["bytes"] += array.nbytes
        if len(chunk.channels) < nch:
            return False
        del self.partial[chunk_id]
        self.evict_partial(before=chunk_id)
        block = dict(chunk.channels[i] for i in range(nch))
        problem = layout_problem(block, chunk.steps) or self._mismatch(block)
        if problem:
            self._drop(chunk, f"chunk {chunk_id} rejected: {problem}")
            raise wire.ProtocolError(f"chunk {chunk_id} rejected: {problem}")
        self.blocks.append(block)
        self.queued_rows += chunk.rows
        self.queued_steps += chunk.steps
        for actor, inc, _seq, rollout_steps, *_ in chunk.rollouts:
            key = f"{actor}:{inc}"
            self.received_steps[key] = self.received_steps.get(key, 0) + int(rollout_steps)
        self.counters["chunks"] += 1
        if chunk.stale:
            self.counters["stale_chunks"] += 1
        elif self.queued_rows < self.QUEUE_BATCHES * self.batch_rows:
            self._grant += 1
        else:
            self.owed_credits += 1
        return True

    def _mismatch(self, block: dict[str, np.ndarray]) -> str | None:
        """A chunk whose trajectory layout differs from the queued ones cannot be stacked."""
        if not self.blocks:
            return None
        first = self.blocks[0]
        for name, array in block.items():
            if array.dtype != first[name].dtype or array.shape[1:] != first[name].shape[1:]:
                return (
                    f"{name} is {array.dtype}{array.shape[1:]}, queued rows have "
                    f"{first[name].dtype}{first[name].shape[1:]}"
                )
        return None

    def evict_partial(self, before: int | None = None) -> None:
        """Drops partial chunks older than ``before`` (all of them when None, at end of stream).

        Chunks reach a trainer in increasing id order, so an older one still partial lost a
        channel on the way (a malformed message): its steps are dropped, its credit returned.
        """
        for old in [c for c in self.partial if before is None or c < before]:
            chunk = self.partial.pop(old)
            self._drop(chunk, f"chunk {old} never completed (a channel was dropped)")
            self.evicted.append(old)

    def reset(self) -> None:
        """The migrator was replaced (it died): partial chunks will never complete (dropped,
        counted), and the credits the old one held are granted again, so the new one sees the
        whole window less what this trainer owes. Chunks of the old one that arrive until the
        new one's FIRST_CHUNK (or below its id) return no slot."""
        self.evict_partial()
        self._grant = max(self.window_chunks - self.owed_credits, 0)
        self.floor_due = True

    def _drop(self, chunk: _Chunk, why: str) -> None:
        logger.error("batcher: %s; %d steps dropped", why, chunk.steps)
        self.dropped_steps += chunk.steps
        if not chunk.stale:
            self._grant += 1

    def ready(self) -> bool:
        """A full batch is queued."""
        return self.queued_rows >= self.batch_rows

    def take(
        self, version: int, max_lag: int, rows: int | None = None, floor_version: int = 0
    ) -> Taken:
        """Removes up to ``rows`` (default ``batch_rows``) rows from the queue as one batch.

        Rows whose oldest step was sampled more than ``max_lag`` versions before ``version``,
        or with a version older than ``floor_version``, are left out and counted as discarded.
        """
        want = min(self.batch_rows if rows is None else rows, self.queued_rows)
        pieces: dict[str, list[np.ndarray]] = collections.defaultdict(list)
        got = 0
        while got < want:
            block = self.blocks[0]
            n = next(iter(block.values())).shape[0]
            use = min(n, want - got)
            for name, array in block.items():
                pieces[name].append(array[:use])
            if use == n:
                self.blocks.popleft()
            else:
                self.blocks[0] = {name: array[use:] for name, array in block.items()}
            got += use
        batch = {k: v[0] if len(v) == 1 else np.concatenate(v) for k, v in pieces.items()}
        steps_per_row = batch["rewards"].shape[1] if got else 0
        self.queued_rows -= got
        self.queued_steps -= got * steps_per_row
        oldest_ok = max(version - max_lag, floor_version)
        fresh = batch["versions"].min(axis=1) >= oldest_ok if got else np.ones(0, bool)
        discarded = int(got - fresh.sum())
        if discarded:
            batch = {k: v[fresh] for k, v in batch.items()}
        self._repay()
        self.counters["batches"] += 1
        kept = got - discarded
        return Taken(batch, kept, kept * steps_per_row, discarded, discarded * steps_per_row)

    def resize(self, batch_rows: int) -> None:
        """A live change of the batch: a bigger one may need rows the credits held back for
        the old one would bring (repaid now: else a queue short of the new batch, with every
        credit held back, would wait for a ``take`` that never comes)."""
        self.batch_rows = max(1, batch_rows)
        self._repay()

    def _repay(self) -> None:
        """Grants again the credits held back while the queue is below its bound."""
        while self.owed_credits and self.queued_rows < self.QUEUE_BATCHES * self.batch_rows:
            self.owed_credits -= 1
            self._grant += 1

    def credits_to_grant(self) -> int:
        """Chunk slots to announce to the migrator now (resets the count)."""
        n, self._grant = self._grant, 0
        return n
