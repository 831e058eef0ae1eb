"""The physical limit: random-action env stepping on N processes, no learning, no transport.

Measured by ``python -m bench limits``. Run as a module, this is the process of the ``limit``
arm of ``python -m bench peers`` (no interface of its own): it writes the summed step count as
a progress curve (``--progress FILE``, ``autotune/workflows/progress_log.py``) every half
second. Nothing here imports torch or touches CUDA, so the GPU stays idle with no context on it.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import queue
import signal
import sys
import time

REPORT_S = 0.5


def _stepper(
    env_id: str,
    envs: int,
    seconds: float,
    seed: int,
    index: int,
    start,
    out,
    backend: str = "gymnasium",
) -> None:
    from runtime.env_backends import make_envs

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's: it ends them
    vec = make_envs(env_id, backend, envs, seed)
    vec.reset()
    batch = getattr(vec, "envs", None)  # gymnasium: each env sampled and stepped by itself
    draw = action_sampler(vec.action_space(), envs, seed)
    out.put((index, None, None))  # ready
    start.wait()
    steps, t0 = 0, time.monotonic()
    last = t0
    while (now := time.monotonic()) - t0 < seconds:
        if batch is not None:
            for env in batch:
                _, _, terminated, truncated, _ = env.step(env.action_space.sample())
                if terminated or truncated:
                    env.reset()
        else:
            vec.step(0, envs, draw())
        steps += envs
        if now - last >= REPORT_S:
            out.put((index, steps, None))
            last = now
    out.put((index, steps, time.monotonic() - t0))


READY_TIMEOUT_S = 300.0
"""How long the stepping processes may take to make their envs."""


def _await_ready(out, procs) -> None:
    """Waits until every process has made its envs; raises RuntimeError (after killing them
    all) as soon as one exits instead, or once ``READY_TIMEOUT_S`` has passed."""
    ready, deadline = set(), time.monotonic() + READY_TIMEOUT_S
    while len(ready) < len(procs):
        try:
            ready.add(out.get(timeout=1.0)[0])
            continue
        except queue.Empty:
            dead = [p.exitcode for p in procs if p.exitcode not in (None, 0)]
            if not dead and time.monotonic() < deadline:
                continue
        for p in procs:
            p.kill()
        why = f"exited {dead[0]}" if dead else f"did not start within {READY_TIMEOUT_S:.0f} s"
        raise RuntimeError(f"raw stepping: a process {why} (its traceback is above)")


def action_sampler(space, k: int, seed: int):
    """Random actions for ``k`` envs at once (numpy, not a Python call per env)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    if hasattr(space, "n"):
        return lambda: rng.integers(0, int(space.n), size=k)
    low, high = np.asarray(space.low, np.float32), np.asarray(space.high, np.float32)
    return lambda: rng.uniform(low, high, size=(k, *low.shape)).astype(np.float32)


def raw_step_rate(
    env_id: str,
    processes: int,
    envs_per_process: int,
    seconds: float,
    progress: str | None = None,
    backend: str = "gymnasium",
) -> float:
    """Aggregate env steps/s of ``processes`` processes stepping random actions together, on
    ``backend`` (``gymnasium``: one env at a time; ``envpool``: one EnvPool instance of
    ``envs_per_process`` envs per process, on one worker thread, resets as an actor takes
    them, ``runtime.env_backends``)."""
    from autotune.workflows.progress_log import ProgressLog

    ctx = mp.get_context("spawn")
    start, out = ctx.Event(), ctx.Queue()
    procs = [
        ctx.Process(
            target=_stepper,
            args=(env_id, envs_per_process, seconds, 1000 * i, i, start, out, backend),
        )
        for i in range(processes)
    ]
    for p in procs:
        p.start()
    log = ProgressLog(progress, every_s=0.0) if progress else None
    try:
        _await_ready(out, procs)
        start.set()
        counts, rates = [0] * processes, {}
        if log:
            log.write(0, force=True)
        deadline = time.monotonic() + seconds + 120
        while len(rates) < processes:
            try:
                index, steps, elapsed = out.get(timeout=max(0.1, deadline - time.monotonic()))
            except queue.Empty:
                raise RuntimeError(
                    f"raw stepping: {processes - len(rates)} of {processes} "
                    f"processes did not finish within {seconds + 120:.0f} s"
                ) from None
            counts[index] = steps
            if elapsed is not None:
                rates[index] = steps / elapsed
            if log:
                log.write(sum(counts))
    except KeyboardInterrupt:  # Ctrl-C: the stepping processes end with it
        for p in procs:
            p.terminate()
        for p in procs:
            p.join()
        raise
    for p in procs:
        p.join()
    if log:
        log.write(sum(counts), force=True)
        log.close()
    return float(sum(rates.values()))


PICK_S = 3.0
"""Seconds each backend steps for ``fastest_backend`` to pick the faster."""


def fastest_backend(env_id: str, processes: int, envs_per_process: int) -> dict[str, float]:
    """Each backend that has ``env_id`` (gymnasium; EnvPool where installed), stepped for
    ``PICK_S`` on every process: its steps/s, the fastest first."""
    from runtime.env_backends import envpool_ids

    found = {}
    for backend in ("gymnasium", "envpool"):
        if backend == "envpool" and env_id not in envpool_ids():
            continue
        found[backend] = raw_step_rate(env_id, processes, envs_per_process, PICK_S, None, backend)
    return dict(sorted(found.items(), key=lambda kv: -kv[1]))


def main() -> None:
    """The limit arm's process (its flags are set by ``bench/compare_arms.py``)."""
    import os

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--env", default="CartPole-v1")
    ap.add_argument("--processes", type=int, default=1, help="0: one per core")
    ap.add_argument("--envs-per-process", type=int, default=8)
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--progress", default=None, metavar="FILE", help="write a progress curve")
    ap.add_argument(
        "--backend",
        choices=("gymnasium", "envpool", "fastest"),
        default="gymnasium",
        help="env backend; fastest: each available one stepped for a few seconds first, then "
        "the measured run on the faster (the limit is the fastest backend's)",
    )
    a = ap.parse_args()
    if a.processes < 0 or a.envs_per_process < 1 or a.seconds <= 0:
        ap.error("--processes must be >= 0, --envs-per-process >= 1 and --seconds > 0")
    processes = a.processes or os.cpu_count() or 1
    picked = {}
    backend = a.backend
    try:
        if backend == "fastest":
            picked = fastest_backend(a.env, processes, a.envs_per_process)
            backend = next(iter(picked))
        rate = raw_step_rate(a.env, processes, a.envs_per_process, a.seconds, a.progress, backend)
    except KeyboardInterrupt:
        print("raw stepping interrupted (Ctrl-C): no rate measured", file=sys.stderr)
        raise SystemExit(130) from None
    doc = {"env": a.env, "processes": processes, "backend": backend, "steps_per_s": rate}
    if picked:
        doc["picked_from"] = picked
    print(json.dumps(doc))


if __name__ == "__main__":
    main()
