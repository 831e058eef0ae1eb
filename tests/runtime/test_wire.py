"""The wire protocol: round trips, zero-copy sizes, and every kind of malformed message."""

from __future__ import annotations

import pickle
import threading
import time

import msgpack
import numpy as np
import pytest
import zmq

from runtime import topology, wire
from runtime.stages.compressor import Compressor
from runtime.stages.dispenser import Dispenser


def test_round_trip_keeps_types_shapes_and_values():
    arrays = [
        np.arange(12, dtype=np.float32).reshape(3, 4),
        np.array([1, 2], np.int64),
        np.zeros((0, 5), np.uint8),
        np.array(True),
    ]
    msg = wire.decode(wire.encode(wire.MsgType.CHUNK, {"chunk": 3, "ch": "obs"}, arrays))
    assert msg.type is wire.MsgType.CHUNK and msg.meta == {"chunk": 3, "ch": "obs"}
    for got, want in zip(msg.arrays, arrays, strict=True):
        assert got.dtype == want.dtype and got.shape == want.shape
        np.testing.assert_array_equal(got, want)


def test_big_endian_and_non_contiguous_arrays_are_normalised():
    a = np.arange(20, dtype=">f8").reshape(4, 5)[:, ::2]
    (got,) = wire.decode(wire.encode(wire.MsgType.ROLLOUT, {}, [a])).arrays
    np.testing.assert_array_equal(got, a)
    assert got.dtype == np.dtype("<f8")


@pytest.mark.parametrize("nbytes", [16, wire.COPY_THRESHOLD - 8, wire.COPY_THRESHOLD * 4])
def test_sockets_carry_small_and_zero_copy_frames(nbytes):
    ctx = zmq.Context()
    a, b = ctx.socket(zmq.PAIR), ctx.socket(zmq.PAIR)
    a.bind("inproc://w")
    b.connect("inproc://w")
    data = np.random.default_rng(0).integers(0, 255, nbytes, dtype=np.uint8)
    wire.send_msg(a, wire.MsgType.ROLLOUT, {"n": nbytes}, [data])
    msg = wire.recv_msg(b)
    np.testing.assert_array_equal(msg.arrays[0], data)
    ctx.destroy(linger=0)


def test_object_arrays_are_refused_on_send():
    with pytest.raises(wire.ProtocolError, match="dtype object"):
        wire.encode(wire.MsgType.ROLLOUT, {}, [np.array([{"a": 1}], dtype=object)])


def _header(**over):
    base = {"v": wire.PROTOCOL_VERSION, "t": "rollout", "m": {}, "a": [["<f4", [2]]]}
    base.update(over)
    return msgpack.packb(base)


@pytest.mark.parametrize(
    ("frames", "match"),
    [
        ([], "empty"),
        ([b"\xc1garbage"], "msgpack"),
        ([msgpack.packb([1, 2])], "map"),
        ([_header(v=99), b"\0" * 8], "version 99"),
        ([_header(t="exec"), b"\0" * 8], "unknown message type"),
        ([_header(), b"\0" * 8, b"extra"], "declares 1 arrays"),
        ([_header(), b"\0" * 7], "needs 8"),
        ([_header(a=[["|O", [2]]]), b"\0" * 16], "not allowed"),
        ([_header(a=[["<f4", [-2]]]), b""], "bad array shape"),
        ([_header(m=[1]), b"\0" * 8], "metadata map"),
        ([pickle.dumps({"v": 1}), b""], "msgpack|map"),
    ],
)
def test_malformed_messages_raise_protocol_error(frames, match):
    with pytest.raises(wire.ProtocolError, match=match):
        wire.decode(frames)


def serving_compressor(tmp_path, key: bytes = b""):
    """A compressor on its real sockets, with the runner's command PUB and a chunk sink."""
    ctx = zmq.Context()
    ep = topology.Endpoints.ipc(str(tmp_path))
    _, commands = topology.runner_sockets(ctx, ep)
    sink = ctx.socket(zmq.PULL)
    sink.bind(ep.chunks)
    pull, push, ctrl = topology.compressor_sockets(ctx, ep)
    compressor = Compressor(pull, push, ctrl, None, chunk_bytes=1, chunk_timeout_s=0.01, key=key)
    return ctx, ep, commands, sink, compressor


def test_compressor_counts_and_drops_malformed_messages_and_keeps_serving(tmp_path):
    ctx, ep, commands, sink, compressor = serving_compressor(tmp_path)
    thread = threading.Thread(target=compressor.run, daemon=True)
    thread.start()
    actor = topology.actor_experience_out(ctx, ep)
    actor.send_multipart([b"not msgpack"])
    actor.send_multipart([_header(v=0), b"\0" * 8])
    wire.send_msg(actor, wire.MsgType.ROLLOUT, {"ch": "obs"}, [np.zeros(2)])  # missing fields
    rollout = {
        "obs": np.ones((1, 3, 2), np.float32),
        "actions": np.zeros((1, 2), np.int64),
        "rewards": np.ones((1, 2), np.float32),
        "dones": np.zeros((1, 2), np.uint8),
        "logp": np.zeros((1, 2), np.float32),
        "versions": np.zeros((1, 2), np.int32),
    }
    dispenser = Dispenser(actor, 0, 0)
    dispenser.dispatch(rollout, 2)
    dispenser.end_of_stream()
    while thread.is_alive():
        commands.send({"cmd": "drain", "expect": {"0:0": 2}})
        thread.join(0.05)
    assert compressor.malformed.count == 3
    assert compressor.counters["rollouts"] == 1  # the good rollout still went through
    received = []
    while sink.poll(100):
        received.append(wire.recv_msg(sink))
    assert [m.type for m in received].count(wire.MsgType.CHUNK) == 6
    assert received[-1].type is wire.MsgType.EOS
    ctx.destroy(linger=0)


def test_a_frame_past_the_inputs_size_cap_is_never_read_into_memory(tmp_path, monkeypatch):
    """A process that pushes a huge frame at the compressor's bound input is disconnected
    unread (libzmq's MAXMSGSIZE); the run's own messages, smaller, still arrive."""
    monkeypatch.setattr(topology, "DATA_MAX_BYTES", 1 << 20)  # as topology reads it
    ctx = zmq.Context()
    ep = topology.Endpoints.ipc(str(tmp_path))
    pull, _push, _commands = topology.compressor_sockets(ctx, ep)
    assert pull.getsockopt(zmq.MAXMSGSIZE) == 1 << 20
    hostile = topology.actor_experience_out(ctx, ep)
    hostile.send(b"x" * (4 << 20))
    actor = topology.actor_experience_out(ctx, ep)
    actor.send(b"small")
    assert pull.poll(10_000)
    assert pull.recv() == b"small"
    assert not pull.poll(500)  # the big one never came
    ctx.destroy(linger=0)


def test_junk_on_the_experience_link_does_not_hold_off_a_drains_give_up(tmp_path, monkeypatch):
    """Draining, the compressor waits for an actor that never sends (it died): after
    DRAIN_IDLE_S with nothing taken it gives up, and what is missing is lost. Junk that another
    process keeps sending (unsigned, undecodable) is not input the drain waits on."""
    from runtime.stages import compressor as compressor_module

    monkeypatch.setattr(compressor_module, "DRAIN_IDLE_S", 1.0)
    ctx, ep, commands, _sink, compressor = serving_compressor(tmp_path, b"k" * 32)
    thread = threading.Thread(target=compressor.run, daemon=True)
    thread.start()
    actor = topology.actor_experience_out(ctx, ep)
    deadline = time.monotonic() + 60  # the give-up is what is tested: its seconds bound it
    while thread.is_alive() and time.monotonic() < deadline:
        commands.send({"cmd": "drain", "expect": {"0:0": 2}})
        wire.send_msg(actor, wire.MsgType.ROLLOUT, {"ch": "obs"}, [np.zeros(2)])  # unsigned
        thread.join(0.2)
    assert not thread.is_alive(), "the drain never gave up: junk held it off"
    assert compressor.malformed.count > 0
    ctx.destroy(linger=0)


@pytest.mark.parametrize(
    "meta",
    [{"actor": "x", "inc": 0}, {"inc": 0}, {"actor": 1.5, "inc": 0}, {"actor": True, "inc": 0}],
)
def test_header_fields_of_the_wrong_type_are_protocol_errors_not_crashes(meta):
    from runtime.stages.migrator import Migrator

    compressor = Compressor(None, None, None, None, 1, 0.01)
    with pytest.raises(wire.ProtocolError):
        compressor.handle(wire.Message(wire.MsgType.EOS, meta))
    with pytest.raises(wire.ProtocolError):
        compressor.handle(wire.Message(wire.MsgType.ROLLOUT, {**meta, "seq": 0}, [np.zeros(1)]))
    migrator = Migrator(None, None, None, 1)
    with pytest.raises(wire.ProtocolError):
        migrator.on_trainer(b"t", wire.Message(wire.MsgType.CREDIT, {"n": meta.get("actor")}))
    with pytest.raises(wire.ProtocolError):
        migrator.on_chunk(
            wire.Message(wire.MsgType.CHUNK, {"chunk": meta.get("actor"), "nch": 1, "steps": 1}), []
        )


@pytest.mark.parametrize(
    ("frames", "match"),
    [
        ([msgpack.packb({"v": wire.PROTOCOL_VERSION, "t": ["x"], "m": {}, "a": []})], "type"),
        ([_header(a=[[["<f4"], [1]]]), b"\0" * 4], "dtype"),
        ([_header(a=[["<f4", [1] * 65]]), b"\0" * 4], "at most"),
        ([_header(a=[["<f4", [2**32, 2**32]]]), b""], "needs"),
        ([_header(a=[["<f4", [True]]]), b"\0" * 4], "bad array shape"),
        ([_header(a=[["<f4", [0, 2**63]]]), b""], "bad array shape"),  # zero bytes, too wide
    ],
)
def test_hostile_headers_are_protocol_errors_not_crashes(frames, match):
    with pytest.raises(wire.ProtocolError, match=match):
        wire.decode(frames)


def test_compressor_rejects_a_rollout_whose_layout_cannot_be_trained():
    compressor = Compressor(None, None, None, None, 1 << 30, 10.0)
    shapes = {
        "obs": (2, 3, 4),
        "actions": (2,),
        "rewards": (2, 2),
        "dones": (2, 2),
        "logp": (2, 2),
        "versions": (2, 2),
    }  # actions is 1-D: bad
    names = list(shapes)
    with pytest.raises(wire.ProtocolError, match="actions has shape"):
        for ci, name in enumerate(names):
            meta = {
                "ch": name,
                "ci": ci,
                "nch": len(names),
                "actor": 0,
                "inc": 0,
                "seq": 0,
                "steps": 4,
                "rows": 2,
            }
            compressor.handle(wire.Message(wire.MsgType.ROLLOUT, meta, [np.zeros(shapes[name])]))
    assert compressor.complete_steps == {} and compressor.counters["rejected_rollouts"] == 1


def test_a_signed_rollout_sent_again_or_with_other_bytes_is_refused():
    """With the run's key the compressor takes a rollout channel once: a copy sent again (even
    after the rollout completed) is refused by its sequence number, and one whose array bytes
    differ from what was signed by its signature."""
    key = b"k" * 32
    c = Compressor(None, None, None, None, 1 << 30, 10.0, key=key)
    shapes = {
        "obs": ((2, 3, 4), np.float32),
        "actions": ((2, 2), np.int64),
        "rewards": ((2, 2), np.float32),
        "dones": ((2, 2), np.uint8),
        "logp": ((2, 2), np.float32),
        "versions": ((2, 2), np.int32),
    }

    def channel(seq: int, ci: int, tamper: bool = False) -> wire.Message:
        name = list(shapes)[ci]
        arr = np.full(shapes[name][0], seq, shapes[name][1])
        meta = {"actor": 0, "inc": 0, "seq": seq, "ci": ci, "nch": len(shapes), "steps": 4}
        meta = wire.sign(key, wire.MsgType.ROLLOUT, meta | {"rows": 2, "ch": name}, [arr])
        return wire.Message(wire.MsgType.ROLLOUT, meta, [arr + 1 if tamper else arr])

    with pytest.raises(wire.ProtocolError, match="without a valid signature"):
        c.handle(channel(0, 0, tamper=True))
    for ci in range(len(shapes)):
        c.handle(channel(0, ci))
    assert c.complete_steps == {"0:0": 4}
    for ci in (0, 5):
        with pytest.raises(wire.ProtocolError, match="sent again"):
            c.handle(channel(0, ci))  # a completed rollout's channels
    c.handle(channel(1, 0))
    with pytest.raises(wire.ProtocolError, match="conflicts"):
        c.handle(channel(1, 0))  # the same channel of the open rollout
    assert sorted(c.partial) == [(0, 0, 1)] and c.complete_steps == {"0:0": 4}
    # a compressor started in place of a dead one serves the incarnations started after it:
    # a copy of an old incarnation's rollout or end of stream is refused, not trained again
    fresh = Compressor(None, None, None, None, 1 << 30, 10.0, key=key)
    fresh.first_inc = {0: 1}
    for msg in (
        channel(0, 0),
        wire.Message(
            wire.MsgType.EOS,
            wire.sign(key, wire.MsgType.EOS, {"actor": 0, "inc": 0, "rollouts": 1}),
        ),
    ):
        with pytest.raises(wire.ProtocolError, match="ran before this compressor"):
            fresh.handle(msg)
    assert not fresh.partial and not fresh.eos_seen


def test_incomplete_rollouts_are_evicted_by_age_and_bytes_and_counted(monkeypatch):
    """A rollout whose other channels never come is not held forever: it is evicted after the
    age limit, and the oldest go first once the bytes limit is passed."""
    from runtime.stages import compressor as comp
    from runtime.stages import partials

    c = comp.Compressor(None, None, None, None, chunk_bytes=1 << 20, chunk_timeout_s=0.05)

    def half_rollout(seq: int, rows: int = 4) -> wire.Message:
        meta = {"actor": 0, "inc": 0, "seq": seq, "ci": 0, "nch": 2, "steps": rows * 8}
        meta |= {"rows": rows, "ch": "obs"}
        return wire.Message(wire.MsgType.ROLLOUT, meta, [np.zeros((rows, 8, 3), np.float32)])

    for seq in range(3):
        c.handle(half_rollout(seq))
    assert len(c.partial) == 3 and c.partial_bytes == 3 * 4 * 8 * 3 * 4
    c.evict()  # young and small: kept
    assert len(c.partial) == 3
    first = c.partial[(0, 0, 0)].first_at
    c.evict(now=first + partials.PARTIAL_MAX_AGE_S + 1)
    assert not c.partial and c.partial_bytes == 0
    assert c.counters["evicted_rollouts"] == 3 and c.counters["evicted_steps"] == 3 * 32
    monkeypatch.setattr(partials, "PARTIAL_MAX_BYTES", 2 * 4 * 8 * 3 * 4)
    for seq in range(3, 7):
        c.handle(half_rollout(seq))
    c.evict()
    assert sorted(c.partial) == [(0, 0, 5), (0, 0, 6)]  # one sender's two newest fit
    assert c.snapshot()["evicted_rollouts"] == 5


@pytest.mark.parametrize("timeout", [float("inf"), float("nan"), 0, -1.0, "1"])
def test_a_live_chunk_timeout_that_is_not_finite_and_above_0_is_refused(timeout):
    from runtime.stages.common import LiveSettings

    meta = {"cmd": "live", "epoch": 1, "chunk_bytes": 1 << 16, "batch_size": 512}
    meta.update(inflight_steps_per_actor=64, chunk_timeout_s=timeout)
    with pytest.raises(wire.ProtocolError, match="chunk_timeout_s"):
        LiveSettings().take(wire.Message(wire.MsgType.COMMAND, meta))
    ok = LiveSettings().take(wire.Message(wire.MsgType.COMMAND, {**meta, "chunk_timeout_s": 0.5}))
    assert ok is not None and ok["chunk_timeout_s"] == 0.5
