"""Rollouts with known contents go dispenser -> compressor -> migrator -> batcher over real
ipc sockets, from several actors interleaving their channel messages, and come back exactly."""

from __future__ import annotations

import random
import threading
import time

import numpy as np
import pytest
import zmq

from runtime import topology, wire
from runtime.stages.batcher import Batcher
from runtime.stages.compressor import Compressor
from runtime.stages.dispenser import CHANNELS, Dispenser
from runtime.stages.migrator import Migrator

K, T, D = 3, 5, 4


def rollout_id(actor: int, seq: int, env: int) -> int:
    return actor * 10_000 + seq * 10 + env


def make_rollout(actor: int, seq: int) -> dict[str, np.ndarray]:
    """Every value of row ``env`` encodes (actor, seq, env), so misalignment is visible."""
    ids = np.array([rollout_id(actor, seq, e) for e in range(K)])
    return {
        "obs": np.broadcast_to(ids[:, None, None], (K, T + 1, D)).astype(np.float32) + 0.5,
        "actions": np.broadcast_to(ids[:, None], (K, T)).astype(np.int64),
        "rewards": np.broadcast_to(ids[:, None], (K, T)).astype(np.float32) * -1,
        "dones": np.broadcast_to((ids % 2)[:, None], (K, T)).astype(np.uint8),
        "logp": np.broadcast_to(ids[:, None], (K, T)).astype(np.float32) / 7,
        "versions": np.broadcast_to(ids[:, None] % 1000, (K, T)).astype(np.int32),
    }


def shuffled_sender(sock: zmq.Socket, actor: int, rollouts: int, rng: random.Random) -> None:
    """An actor that sends its rollouts' channels in random order, interleaving rollouts."""
    messages = []
    for seq in range(rollouts):
        r = make_rollout(actor, seq)
        for ci, name in enumerate(CHANNELS):
            meta = {
                "ch": name,
                "ci": ci,
                "nch": len(CHANNELS),
                "actor": actor,
                "inc": 0,
                "seq": seq,
                "steps": K * T,
                "rows": K,
            }
            messages.append((meta, r[name]))
    rng.shuffle(messages)
    for meta, array in messages:
        wire.send_msg(sock, wire.MsgType.ROLLOUT, meta, [array])
    wire.send_msg(sock, wire.MsgType.EOS, {"actor": actor, "inc": 0})


def dispenser_sender(sock: zmq.Socket, actor: int, rollouts: int) -> None:
    dispenser = Dispenser(sock, actor, 0)
    for seq in range(rollouts):
        dispenser.dispatch(make_rollout(actor, seq), K * T)
    dispenser.end_of_stream()


@pytest.mark.parametrize(
    ("chunk_bytes", "transport"), [(1, "ipc"), (2_000, "ipc"), (1 << 20, "ipc"), (2_000, "inproc")]
)
def test_rollouts_come_back_exactly(tmp_path, chunk_bytes, transport):
    ctx = zmq.Context()
    ep = (
        topology.Endpoints.ipc(str(tmp_path))
        if transport == "ipc"
        else topology.Endpoints.inproc(f"align-{chunk_bytes}")
    )
    _, commands = topology.runner_sockets(ctx, ep)
    compressor = Compressor(*topology.compressor_sockets(ctx, ep), None, chunk_bytes, 0.005)
    pull, router, _, _ = topology.migrator_sockets(ctx, ep)
    migrator = Migrator(pull, router, None, n_trainers=1)
    services = [threading.Thread(target=s.run, daemon=True) for s in (compressor, migrator)]
    for t in services:
        t.start()
    dealer = topology.trainer_experience_in(ctx, ep, topology.trainer_name(0))
    batcher = Batcher(batch_rows=7, window_chunks=2)  # 7 rows: slices and stacks chunks

    n_actors, n_rollouts, rng = 4, 6, random.Random(0)
    senders = []
    for actor in range(n_actors):
        sock = topology.actor_experience_out(ctx, ep)
        if actor % 2:
            target, args = shuffled_sender, (sock, actor, n_rollouts, random.Random(actor))
        else:
            target, args = dispenser_sender, (sock, actor, n_rollouts)
        senders.append(threading.Thread(target=target, args=args, daemon=True))
    rng.shuffle(senders)
    for t in senders:
        t.start()

    expect = {f"{a}:0": n_rollouts * K * T for a in range(n_actors)}
    batches, eos = [], False
    while not eos or batcher.queued_rows:
        commands.send({"cmd": "drain", "expect": expect})
        n = batcher.credits_to_grant()
        if n:
            wire.send_msg(dealer, wire.MsgType.CREDIT, {"n": n, "queued_steps": 0})
        while dealer.poll(20):
            msg = wire.recv_msg(dealer)
            if msg.type is wire.MsgType.EOS:
                eos = True
            else:
                batcher.add(msg)
        while batcher.ready() or (eos and batcher.queued_rows):
            batches.append(batcher.take(version=0, max_lag=10**9).batch)
    for t in services + senders:
        t.join(timeout=10)
        assert not t.is_alive()

    rows = {name: np.concatenate([b[name] for b in batches]) for name in CHANNELS}
    ids = rows["actions"][:, 0]
    expected = sorted(
        rollout_id(a, s, e) for a in range(n_actors) for s in range(n_rollouts) for e in range(K)
    )
    assert sorted(ids.tolist()) == expected  # every row once: nothing lost or duplicated
    for i, rid in enumerate(ids):  # every channel of a row comes from the same rollout row
        a, rem = divmod(int(rid), 10_000)
        seq, env = divmod(rem, 10)
        ref = make_rollout(a, seq)
        for name in CHANNELS:
            np.testing.assert_array_equal(rows[name][i], ref[name][env], err_msg=name)
    assert compressor.counters["rollouts"] == n_actors * n_rollouts
    assert compressor.partial == {}
    assert sum(batcher.received_steps.values()) == n_actors * n_rollouts * K * T
    ctx.destroy(linger=0)


def test_an_idle_compressor_reports_twice_a_second_whatever_its_chunk_timeout(tmp_path):
    """A long ``chunk_timeout_s`` (a minute) must not stretch the compressor's poll: an idle
    compressor (its actors held back by a slow learner) still reports every
    ``STATS_INTERVAL_S``, or the runner would call it stalled and replace it."""
    from runtime.stages.compressor import STATS_INTERVAL_S

    class Reports:
        def __init__(self):
            self.times: list[float] = []

        def send(self, _snapshot) -> None:
            self.times.append(time.monotonic())

    ctx = zmq.Context()
    ep = topology.Endpoints.ipc(str(tmp_path))
    _, commands = topology.runner_sockets(ctx, ep)
    reports = Reports()
    compressor = Compressor(*topology.compressor_sockets(ctx, ep), reports, 1 << 20, 60.0)
    thread = threading.Thread(target=compressor.run, daemon=True)
    thread.start()
    try:
        while len(reports.times) < 4 and thread.is_alive():  # waits on the reports themselves
            time.sleep(0.05)
        gaps = [b - a for a, b in zip(reports.times, reports.times[1:], strict=False)]
        assert len(gaps) >= 3 and max(gaps) < 10 * STATS_INTERVAL_S, gaps
    finally:
        commands.send({"cmd": "drain", "expect": {}})
        thread.join(30)
        ctx.destroy(linger=0)
