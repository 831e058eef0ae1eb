"""Batcher: chunk reassembly, slicing/stacking into batches, credits, stale-row discarding."""

from __future__ import annotations

import numpy as np
import pytest

from runtime import wire
from runtime.stages.batcher import Batcher
from runtime.stages.dispenser import CHANNELS

T = 4


def chunk_messages(chunk: int, rows: int, first_row: int, version: int = 0) -> list[wire.Message]:
    ids = np.arange(first_row, first_row + rows)
    arrays = {
        "obs": np.repeat(ids[:, None, None], T + 1, 1).astype(np.float32),
        "actions": np.repeat(ids[:, None], T, 1),
        "rewards": np.ones((rows, T), np.float32),
        "dones": np.zeros((rows, T), np.uint8),
        "logp": np.zeros((rows, T), np.float32),
        "versions": np.full((rows, T), version, np.int32),
    }
    meta = {
        "chunk": chunk,
        "nch": len(CHANNELS),
        "steps": rows * T,
        "rows": rows,
        "rollouts": [[0, 0, chunk, rows * T, rows]],
    }
    return [
        wire.Message(wire.MsgType.CHUNK, {**meta, "ch": n, "ci": i}, [arrays[n]])
        for i, n in enumerate(CHANNELS)
    ]


def test_a_chunk_counts_only_when_all_channels_arrived_in_any_order():
    b = Batcher(batch_rows=2)
    msgs = chunk_messages(0, 3, 0)
    assert [b.add(m) for m in reversed(msgs)] == [False] * 5 + [True]
    assert b.queued_rows == 3 and b.queued_steps == 3 * T
    assert b.received_steps == {"0:0": 3 * T}


def test_slices_big_chunks_and_stacks_small_ones_in_order():
    b = Batcher(batch_rows=4)
    for m in chunk_messages(0, 6, 0) + chunk_messages(1, 1, 6) + chunk_messages(2, 1, 7):
        b.add(m)
    first, second = b.take(0, 10), b.take(0, 10)
    assert first.batch["actions"][:, 0].tolist() == [0, 1, 2, 3]  # sliced
    assert second.batch["actions"][:, 0].tolist() == [4, 5, 6, 7]  # stacked from three chunks
    assert first.steps == 4 * T and b.queued_rows == 0 and not b.ready()


def test_stale_rows_are_discarded_and_counted():
    b = Batcher(batch_rows=4)
    for m in chunk_messages(0, 2, 0, version=1) + chunk_messages(1, 2, 2, version=9):
        b.add(m)
    taken = b.take(version=10, max_lag=3)
    assert taken.rows == 2 and taken.discarded_rows == 2 and taken.discarded_steps == 2 * T
    assert taken.batch["actions"][:, 0].tolist() == [2, 3]


def test_credits_start_at_the_window_and_are_withheld_while_two_batches_wait():
    b = Batcher(batch_rows=2, window_chunks=3)
    assert b.credits_to_grant() == 3 and b.credits_to_grant() == 0
    for m in chunk_messages(0, 2, 0):
        b.add(m)
    assert b.credits_to_grant() == 1  # 2 rows < 2 batches: slot returned at once
    for m in chunk_messages(1, 2, 2):
        b.add(m)
    assert b.credits_to_grant() == 0  # 4 rows = two batches waiting: slot owed
    b.take(0, 10)
    assert b.credits_to_grant() == 1  # paid after a batch was taken


def test_a_bigger_batch_set_live_gets_the_credits_held_back_for_the_old_one():
    """The queue held two old batches with every credit held back; the new batch is bigger
    than the queue, so no batch can be taken to pay them: the resize grants them again."""
    b = Batcher(batch_rows=2, window_chunks=2)
    assert b.credits_to_grant() == 2
    for chunk in range(2):
        for m in chunk_messages(chunk, 2, 2 * chunk):
            b.add(m)
    assert b.credits_to_grant() == 1 and b.owed_credits == 1  # 4 rows: two batches wait
    b.resize(8)
    assert not b.ready() and b.credits_to_grant() == 1 and b.owed_credits == 0
    for chunk in range(2, 4):  # the credits bring the rows the new batch needs
        for m in chunk_messages(chunk, 2, 2 * chunk):
            b.add(m)
    assert b.ready() and b.take(0, 10).rows == 8
    b.resize(1)  # smaller: nothing is owed or granted by the change itself
    assert b.batch_rows == 1 and b.owed_credits == 0


def test_conflicting_or_foreign_messages_are_protocol_errors():
    b = Batcher(batch_rows=2)
    msgs = chunk_messages(0, 2, 0)
    b.add(msgs[0])
    with pytest.raises(wire.ProtocolError, match="conflicts"):
        b.add(msgs[0])
    with pytest.raises(wire.ProtocolError):
        b.add(wire.Message(wire.MsgType.CREDIT, {"n": 1}))


def test_a_chunk_that_lost_a_channel_is_evicted_counted_and_its_credit_returned():
    b = Batcher(batch_rows=2, window_chunks=1)
    assert b.credits_to_grant() == 1
    for m in chunk_messages(0, 2, 0)[:-1]:  # its last channel was dropped on the way
        b.add(m)
    for m in chunk_messages(1, 2, 2):
        b.add(m)
    assert b.partial == {} and b.dropped_steps == 2 * T
    assert b.credits_to_grant() == 2  # one for chunk 1, one returned for the evicted chunk 0
    b.add(chunk_messages(2, 2, 4)[0])
    b.evict_partial()  # end of stream
    assert b.dropped_steps == 4 * T


def test_a_chunk_with_another_trajectory_length_is_rejected_whole():
    b = Batcher(batch_rows=4)
    for m in chunk_messages(0, 2, 0):
        b.add(m)
    other = chunk_messages(1, 2, 2)
    for m in other:
        if m.meta["ch"] == "obs":
            m.arrays[0] = np.zeros((2, T + 2, 1), np.float32)  # T+1 steps instead of T
    with pytest.raises(wire.ProtocolError, match="rejected"):
        for m in other:
            b.add(m)
    assert b.dropped_steps == 2 * T and b.queued_rows == 2


def test_a_reset_drops_partial_chunks_once_and_grants_the_window_again():
    """After the migrator was replaced: the chunk half-delivered by the old one is dropped and
    counted once, even when its last channels arrive after the reset, and the new migrator is
    granted the whole window again."""
    b = Batcher(batch_rows=8, window_chunks=4)
    assert b.credits_to_grant() == 4  # all held by the old migrator
    for m in chunk_messages(0, 2, 0):
        b.add(m)  # one whole chunk: its credit comes back
    half = chunk_messages(1, 2, 2)
    for m in half[:2]:
        b.add(m)
    b.credits_to_grant()
    b.reset()
    assert b.dropped_steps == 2 * T and b.partial == {}
    assert b.credits_to_grant() == 4  # nothing owed: the whole window
    for m in half[2:]:  # the rest of the dropped chunk, late from the old migrator's queue
        assert b.add(m) is False
    assert b.partial == {} and b.dropped_steps == 2 * T
    assert b.counters["late_channels"] == len(half) - 2


class NewMigrator:
    """The credits a replacement migrator holds and its chunks in flight to one batcher."""

    def __init__(self, b: Batcher) -> None:
        self.b, self.held, self.in_flight = b, b.credits_to_grant(), []

    def send(self, chunk_id: int) -> None:
        self.held -= 1
        self.in_flight.append(chunk_id)

    def arrive(self, msgs: list[wire.Message], ours: bool) -> None:
        """The batcher reads a whole chunk (``ours``: this migrator's), then grants."""
        for m in msgs:
            self.b.add(m)
        if ours:
            self.in_flight.remove(msgs[0].meta["chunk"])
        self.held += self.b.credits_to_grant()
        assert self.held + len(self.in_flight) + self.b.owed_credits <= self.b.window_chunks


def test_after_a_reset_the_live_credits_never_exceed_the_window():
    """The dead migrator had sent two chunks the trainer had not read when it took the reset;
    they complete afterwards (one before the new migrator's FIRST_CHUNK, one after it) and
    return no slot: the credits the new migrator holds plus its chunks in flight and the owed
    slots stay within the window, however many replacements there are."""
    stride = 1 << 40
    b = Batcher(batch_rows=64, window_chunks=4)
    assert b.credits_to_grant() == 4  # held by the first migrator
    row = 0
    for replacement in (1, 2):
        old = [chunk_messages((replacement - 1) * stride + i, 1, row + i) for i in range(2)]
        row += 2
        b.reset()
        new = NewMigrator(b)
        assert new.held == 4
        new.arrive(old[0], ours=False)
        first = {"chunk": replacement * stride}
        b.add(wire.Message(wire.MsgType.FIRST_CHUNK, first, []))
        for i in range(3):
            new.send(replacement * stride + i)
        new.arrive(old[1], ours=False)
        for cid in list(new.in_flight):
            new.arrive(chunk_messages(cid, 1, row), ours=True)
            row += 1
        assert new.held == 4 and b.counters["stale_chunks"] == 2 * replacement
    assert b.queued_rows == row and b.dropped_steps == 0
