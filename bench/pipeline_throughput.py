"""The experience path alone, on synthetic rollouts: the four stages vs simpler transports.

    python -m bench pipeline --producers 2 --seconds 3

For each rollout size, side by side in one run (same producers, same payload):
  raw        pyzmq PUSH/PULL of one opaque frame per rollout (the transport's ceiling)
  per-rollout one wire message per rollout (all channels as frames), straight to the consumer
  stages-1   dispenser -> compressor -> migrator -> batcher with chunk_bytes=1 (no concatenation)
  stages     the same with the compressor concatenating up to --chunk-bytes
The consumer reports rollouts/s, payload MB/s and messages/s it received.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import tempfile
import time

import numpy as np

SIZES = {"cartpole-like": (8, 32, 4, 2), "ant-like": (16, 32, 105, 8)}
"""name -> (envs K, rollout length T, obs dim D, action dim A)."""


def synthetic_rollout(k: int, t: int, d: int, a: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {
        "obs": rng.random((k, t + 1, d), np.float32),
        "actions": rng.random((k, t, a), np.float32),
        "rewards": rng.random((k, t), np.float32),
        "dones": np.zeros((k, t), np.uint8),
        "logp": rng.random((k, t), np.float32),
        "versions": np.zeros((k, t), np.int32),
    }


def _producer(
    mode: str, endpoint: str, index: int, size: tuple, seconds: float, start, done, key: bytes
) -> None:
    import zmq

    from runtime import topology, wire
    from runtime.stages.dispenser import Dispenser

    rollout = synthetic_rollout(*size)
    steps = size[0] * size[1]
    ctx = zmq.Context()
    sock = ctx.socket(zmq.PUSH)
    sock.setsockopt(zmq.SNDHWM, topology.EXPERIENCE_HWM)
    sock.connect(endpoint)
    blob = b"".join(bytes(memoryview(v).cast("B")) for v in rollout.values())
    dispenser = Dispenser(sock, index, 0, key)
    start.wait()
    t0 = time.monotonic()
    while time.monotonic() - t0 < seconds:
        if mode == "raw":
            sock.send(blob, copy=len(blob) < wire.COPY_THRESHOLD)
        elif mode == "per-rollout":
            meta = {"actor": index, "steps": steps}
            wire.send_msg(sock, wire.MsgType.ROLLOUT, meta, list(rollout.values()))
        else:
            dispenser.dispatch(rollout, steps)
    if mode == "raw":
        sock.send(b"")
    elif mode == "per-rollout":
        wire.send_msg(sock, wire.MsgType.EOS, {"actor": index})
    else:
        dispenser.end_of_stream()
    done.wait()  # closing under back-pressure could drop the queued tail (see runtime.actor)
    ctx.destroy(linger=0)


def _direct_consumer(mode: str, endpoint: str, producers: int, out) -> None:
    import zmq

    from runtime import wire

    ctx = zmq.Context()
    sock = ctx.socket(zmq.PULL)
    sock.bind(endpoint)
    ended = messages = nbytes = rollouts = 0
    t0 = None
    while ended < producers:
        frames = sock.recv_multipart(copy=False)
        t0 = t0 or time.monotonic()
        if mode == "raw":
            if len(frames[0]) == 0:
                ended += 1
                continue
            nbytes += len(frames[0])
            rollouts += 1
        else:
            msg = wire.decode(frames)
            if msg.type is wire.MsgType.EOS:
                ended += 1
                continue
            nbytes += msg.nbytes
            rollouts += 1
        messages += 1
    out.put(
        {
            "elapsed_s": time.monotonic() - t0,
            "messages": messages,
            "bytes": nbytes,
            "rollouts": rollouts,
        }
    )
    ctx.destroy(linger=0)


def _stage_consumer(endpoints, batch_rows: int, out) -> None:
    import zmq

    from runtime import topology, wire
    from runtime.stages.batcher import Batcher

    ctx = zmq.Context()
    dealer = topology.trainer_experience_in(ctx, endpoints, topology.trainer_name(0))
    batcher = Batcher(batch_rows)
    t0, eos, rollouts, sent = None, False, 0, 0
    while not eos:
        n = batcher.credits_to_grant()
        if n:
            meta = wire.credit_meta(endpoints.run_key, topology.trainer_name(0), n, 0, sent)
            wire.send_msg(dealer, wire.MsgType.CREDIT, meta)
            sent += 1
        if not dealer.poll(100):
            continue
        msg = wire.recv_msg(dealer)
        t0 = t0 or time.monotonic()
        if msg.type is wire.MsgType.EOS:
            eos = True
        elif batcher.add(msg):
            rollouts += len(msg.meta["rollouts"])
        while batcher.ready():
            batcher.take(0, 10**9)
    c = batcher.counters
    out.put(
        {
            "elapsed_s": time.monotonic() - t0,
            "messages": c["messages"],
            "bytes": c["bytes"],
            "rollouts": rollouts,
        }
    )
    ctx.destroy(linger=0)


def measure(mode: str, producers: int, size: tuple, seconds: float, chunk_bytes: int) -> dict:
    from runtime import topology
    from runtime.stages.compressor import compressor_main
    from runtime.stages.migrator import migrator_main

    ctx = mp.get_context("spawn")
    start, out, done = ctx.Barrier(producers + 1), ctx.Queue(), ctx.Event()
    with tempfile.TemporaryDirectory() as run_dir:
        ep = topology.Endpoints.ipc(run_dir)
        services = []
        if mode.startswith("stages"):
            import zmq

            zctx = zmq.Context()
            _, commands = topology.runner_sockets(zctx, ep)
            cb = 1 if mode == "stages-1" else chunk_bytes
            services = [
                ctx.Process(target=compressor_main, args=(ep, cb, 0.01)),
                ctx.Process(target=migrator_main, args=(ep, 1)),
                ctx.Process(target=_stage_consumer, args=(ep, size[0] * 4, out)),
            ]
            target = ep.experience
        else:
            target = ep.experience
            services = [ctx.Process(target=_direct_consumer, args=(mode, target, producers, out))]
        prods = [
            ctx.Process(
                target=_producer,
                args=(mode, target, i, size, seconds, start, done, ep.run_key),
            )
            for i in range(producers)
        ]
        try:
            for p in services + prods:
                p.start()
            start.wait()
            if mode.startswith("stages"):
                expect = {f"{i}:0": 2**62 for i in range(producers)}  # only their EOS ends it
                while out.empty():
                    commands.send({"cmd": "drain", "expect": expect})
                    time.sleep(0.2)
            r = out.get(timeout=seconds + 120)
            done.set()
            for p in prods + services:
                while p.is_alive():
                    if mode.startswith("stages"):
                        commands.send({"cmd": "exit"})
                    p.join(timeout=0.1)
        except BaseException:  # no process of the step left waiting for a drain that never comes
            for p in prods + services:
                if p.is_alive():
                    p.kill()
            raise
        if mode.startswith("stages"):
            zctx.destroy(linger=0)
    e = r["elapsed_s"]
    return {
        "mode": mode,
        "rollouts_per_s": r["rollouts"] / e,
        "mb_per_s": r["bytes"] / e / 1e6,
        "messages_per_s": r["messages"] / e,
        "rollouts": r["rollouts"],
    }


def table(rows: list[dict]) -> str:
    """The Markdown table of ``rows``, each mode's rollouts/s beside raw's."""
    lines = [
        "| size | rollout KB | mode | rollouts/s | MB/s | messages/s | vs raw |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        raw = next(x for x in rows if x["size"] == r["size"] and x["mode"] == "raw")
        lines.append(
            f"| {r['size']} | {r['rollout_kb']} | {r['mode']} | {r['rollouts_per_s']:,.0f} | "
            f"{r['mb_per_s']:,.0f} | {r['messages_per_s']:,.0f} | "
            f"{r['rollouts_per_s'] / raw['rollouts_per_s']:.2f} |"
        )
    return "\n".join(lines)


def size_rows(name: str, producers: int, seconds: float, chunk_bytes: int) -> list[dict]:
    """The four modes' rows for one rollout size, one after the other."""
    size = SIZES[name]
    rollout_kb = sum(v.nbytes for v in synthetic_rollout(*size).values()) / 1024
    rows = []
    for mode in ("raw", "per-rollout", "stages-1", "stages"):
        row = measure(mode, producers, size, seconds, chunk_bytes)
        rows.append({"size": name, "rollout_kb": round(rollout_kb, 1), **row})
        print(json.dumps(rows[-1]), flush=True)
    return rows
