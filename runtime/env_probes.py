"""The env-step probes of ``runtime.probes``: one env's CPU cost per step alone, and with one
stepping process on every usable core at once (what an actor pays when the run fills the
cores). They run before torch is imported, so the spawned processes stay light."""

from __future__ import annotations

import time

import numpy as np

PROBE_S = 0.2
"""About how long each timed loop of the probes runs."""
LOADED_S = 1.0
"""How long the loaded env-step probe steps in every process at once."""


class ProbeError(RuntimeError):
    """The workload could not be probed; the message says why."""


def probe_env_step(env_id: str, seed: int = 0) -> float:
    """CPU seconds per step of one env with random actions (resets included as they come)."""
    from runtime.envs import make_env

    env = make_env(env_id)
    try:
        env.reset(seed=seed)
        env.action_space.seed(seed)
        steps, start = 0, time.process_time()
        wall = time.perf_counter()
        while steps < 50 or time.perf_counter() - wall < PROBE_S:
            _, _, term, trunc, _ = env.step(env.action_space.sample())
            steps += 1
            if term or trunc:
                env.reset()
        return max(time.process_time() - start, 1e-9) / steps
    finally:
        env.close()


def _step_loaded(env_id: str, seed: int, barrier, results, seconds: float) -> None:
    """One process of ``probe_env_step_loaded``: make the env, wait for the others, step."""
    from runtime.envs import make_env

    env = make_env(env_id)
    env.reset(seed=seed)
    env.action_space.seed(seed)
    barrier.wait(timeout=120)
    steps, start, wall = 0, time.process_time(), time.perf_counter()
    while steps < 50 or time.perf_counter() - wall < seconds:
        _, _, term, trunc, _ = env.step(env.action_space.sample())
        steps += 1
        if term or trunc:
            env.reset()
    results.put(max(time.process_time() - start, 1e-9) / steps)
    env.close()


def probe_env_step_loaded(env_id: str, procs: int, seconds: float = LOADED_S) -> float:
    """CPU seconds per env step with ``procs`` processes stepping at once, started together
    (the median over them). A MuJoCo step costs about 1.4x as much with every core of a
    16-core host busy as alone; a run whose actors fill the cores pays the loaded cost."""
    import multiprocessing as mp

    ctx = mp.get_context("spawn")  # no inherited NVML or torch state
    barrier, results = ctx.Barrier(procs), ctx.Queue()
    workers = [
        ctx.Process(target=_step_loaded, args=(env_id, i, barrier, results, seconds), daemon=True)
        for i in range(procs)
    ]
    for w in workers:
        w.start()
    try:
        costs = [results.get(timeout=180) for _ in workers]
    except Exception:
        raise ProbeError(f"the loaded env-step probe of {env_id!r} did not finish") from None
    finally:
        for w in workers:
            w.join(timeout=5)
            if w.is_alive():
                w.kill()
    return float(np.median(costs))
