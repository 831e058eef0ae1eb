"""Every socket a running job binds for input, fuzzed while it trains: the actors'
experience, everyone's telemetry, the migrator's chunks and trainers, and the inference GMI's
requests. Random frames,
truncated and hostile headers, huge declared sizes, deep nesting, valid headers of the wrong
kind, unsigned chunks, credits and ends of stream, rollouts that never complete. The run
finishes, its step accounting stays exact, and every fuzz message is counted.

(The sockets the run's processes bind for output, receipts, weights and commands, take
nothing in: a SUB that connects there only reads. Forged weights, published into the
weights forwarder's input, are dropped by every actor: the last test here.)"""

from __future__ import annotations

import random

import msgpack
import numpy as np
import pytest
import zmq

from runtime import wire
from runtime.config import TrainConfig
from runtime.runner import Runner

pytestmark = pytest.mark.slow

PER_SOCKET = 200


PARTIAL = 6
"""The kind of fuzz message that is a valid rollout channel (held, never malformed)."""


def _hostile(rng: random.Random, kind: int) -> list[bytes]:
    """One fuzz message (its frames) of ``kind`` (0..7)."""
    v = wire.PROTOCOL_VERSION
    if kind == 0:
        return [rng.randbytes(rng.randrange(0, 64)) for _ in range(rng.randrange(1, 4))]
    if kind == 1:  # truncated header
        return [msgpack.packb({"v": v, "t": "rollout", "m": {"a": 1}, "a": []})[:-3]]
    if kind == 2:  # huge declared array
        head = {"v": v, "t": "chunk", "m": {}, "a": [["<f4", [2**31, 2**31]]]}
        return [msgpack.packb(head), b"\0" * 16]
    if kind == 3:  # deep nesting: 5000 one-element arrays, one inside the other
        return [b"\x91" * 5000 + b"\x00"]
    if kind == 4:  # valid frames, the wrong message for any stage here
        return wire.encode(wire.MsgType.EOS, {"stage": 7, "actor": "x"})
    if kind == 5:
        return wire.encode(wire.MsgType.STATS, {"src": 3, "c": [1]})
    if kind == PARTIAL:  # a rollout channel that never completes, and nonsense values
        meta = {"actor": 99, "inc": 0, "seq": rng.randrange(10**6), "ci": 0, "nch": 2}
        meta |= {"steps": 8, "rows": 1, "ch": "obs"}
        return wire.encode(wire.MsgType.ROLLOUT, meta, [np.zeros((1, 8, 4), np.float32)])
    return wire.encode(wire.MsgType.CREDIT, {"n": -5, "queued_steps": "many"})


def test_fuzzing_every_input_socket_leaves_the_run_whole_and_counted():
    cfg = TrainConfig(steps=16_000, actors=2, envs_per_actor=4, rollout_len=16, batch_size=512)
    ctx = zmq.Context()
    rng = random.Random(0)
    sent: dict[str, int] = {}
    socks: list[zmq.Socket] = []  # open until the run ends: a closed socket drops its queue
    runner: Runner

    def fuzz(state):
        if sent or state.trained_steps < 1_000:
            return
        d = runner.run_dir
        targets = {
            "experience": zmq.PUSH,
            "telemetry": zmq.PUSH,
            "chunks": zmq.PUSH,
            "trainers": zmq.DEALER,
        }
        for name, kind in targets.items():
            sock = ctx.socket(kind)
            sock.setsockopt(zmq.LINGER, 2000)
            if kind == zmq.DEALER:  # named like a trainer: the migrator reads what it sends
                sock.setsockopt(zmq.IDENTITY, b"trainer-9.g0")
            sock.connect(f"ipc://{d}/{name}")
            socks.append(sock)
            kinds = [rng.randrange(8) for _ in range(PER_SOCKET)]
            for kind in kinds:
                sock.send_multipart(_hostile(rng, kind))
            sent[name] = sum(k != PARTIAL for k in kinds)

    runner = Runner(cfg, cfg.validate(), on_progress=fuzz)
    try:
        result = runner.run()
    finally:
        ctx.destroy(linger=2000)
    assert sent, "the run ended before the fuzz"
    assert result["sampled_steps"] == (
        result["env_steps"] + result["discarded_steps"] + result["lost_steps"]
    )
    assert result["env_steps"] >= cfg.steps and result["lost_steps"] == 0
    bad = result["malformed"]
    # the compressor takes only what the run's actors signed: every fuzz message is counted,
    # the unsigned rollout channels too
    assert bad["compressor"] == PER_SOCKET
    assert bad["runner"] == PER_SOCKET  # none of them is a stats message from a process
    # the migrator takes only what the run's compressor and trainers signed: all of it counted
    assert bad["migrator"] == 2 * PER_SOCKET


def test_fuzzing_the_inference_gmis_socket_leaves_the_run_whole_and_counted():
    """With ``inference='gmi'`` the inference GMI binds a ROUTER every actor connects to; what
    is not a well-formed request of the run's shape is counted and dropped, and the actors'
    own requests are still answered."""
    cfg = TrainConfig(
        steps=8_000, actors=2, envs_per_actor=4, rollout_len=16, batch_size=512, inference="gmi"
    )
    ctx = zmq.Context()
    rng = random.Random(1)
    socks: list[zmq.Socket] = []
    runner: Runner

    def fuzz(state):
        if socks or state.trained_steps < 1_000:
            return
        sock = ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 2000)
        sock.connect(f"ipc://{runner.run_dir}/inference")
        socks.append(sock)
        for _ in range(PER_SOCKET):
            sock.send_multipart(_hostile(rng, rng.randrange(8)))

    runner = Runner(cfg, cfg.validate(), on_progress=fuzz)
    try:
        result = runner.run()
    finally:
        ctx.destroy(linger=2000)
    assert socks, "the run ended before the fuzz"
    assert result["sampled_steps"] == result["env_steps"] + result["discarded_steps"]
    assert result["env_steps"] >= cfg.steps and result["lost_steps"] == 0
    assert result["malformed"]["inference"] == PER_SOCKET


def test_forged_weights_on_the_runs_socket_are_dropped_and_counted():
    """Weights published to the run's weights socket by anyone but its trainer (a huge version,
    unsigned) are dropped by every actor and counted; the real updates keep arriving."""
    cfg = TrainConfig(
        steps=10**9, actors=2, envs_per_actor=4, rollout_len=16, batch_size=512
    )  # ends once the actors have counted a forgery, and trained on
    ctx = zmq.Context()
    pub: list = []
    counted_at: list[int] = []
    runner: Runner

    def forge(state):
        if state.trained_steps < 1_000:
            return
        tel = runner.telemetry
        if not counted_at and any(tel.source(a).get("malformed") for a in tel.actor_sources()):
            counted_at.append(state.trained_steps)
        if counted_at and state.trained_steps >= counted_at[0] + 2_048:
            runner.stop_requested = True  # drains, as Ctrl-C does
            return
        if not pub:
            sock = ctx.socket(zmq.PUB)
            sock.connect(f"ipc://{runner.run_dir}/weights_in")
            pub.append(sock)
        meta = {"version": 10**9, "names": ["pi.0.weight"], "mac": "0" * 64}
        wire.send_msg(pub[0], wire.MsgType.WEIGHTS, meta, [np.zeros((1, 1), np.float32)])

    runner = Runner(cfg, cfg.validate(), on_progress=forge)
    try:
        result = runner.run()
    finally:
        ctx.destroy(linger=0)
    assert result["sampled_steps"] == (
        result["env_steps"] + result["discarded_steps"] + result["lost_steps"]
    )
    assert result["malformed"]["actors"] > 0  # seen, dropped and counted
    assert 0 <= result["policy_lag"]["mean"] < 100 and result["policy_lag"]["max"] < 10**6
