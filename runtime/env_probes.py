"""The env-step probes of ``runtime.probes``: one env's CPU cost per step alone, and an actor's
round (its envs stepped, one policy forward) with one such actor on every usable core at once
(what an actor pays when the run fills the cores). They run before torch is imported, so the
spawned processes stay light."""

from __future__ import annotations

import math
import time

import numpy as np

PROBE_S = 0.2
"""About how long each timed loop of the probes runs."""
LOADED_S = 1.0
"""About how long the loaded probe runs an actor's rounds at each env count, in every process
at once."""


ENV_BATCHES = (1, 8, 32)
"""Env counts one policy forward is timed at (the forward's fixed and per-env cost)."""


class ProbeError(RuntimeError):
    """The workload could not be probed; the message says why."""


def timed(
    fn,
    budget_s: float = PROBE_S,
    least: int = 3,
    first: list | None = None,
    clock=time.perf_counter,
) -> float:
    """Seconds per call of ``fn`` on ``clock``: called until ``budget_s`` passed (as time
    passes) and at least ``least`` times, after one untimed call (its wall seconds appended to
    ``first`` if given: a compile, a graph's capture); the median of the calls. Work that runs
    on the calling thread alone (a numpy forward on one BLAS thread, a one-thread CPU update)
    is timed on ``time.thread_time``: the seconds it waited for a core that another process
    held do not count, so a probe on a busy machine does not cache a cost several times the
    real one (a CPU update timed at 4.4x its quiet cost as wall time with three busy processes
    per core of a 2-core machine, 1.25x on its thread's clock); a GPU's work, on the wall clock
    (the thread waits for it)."""
    t = time.perf_counter()
    fn()
    if first is not None:
        first.append(time.perf_counter() - t)
    times: list[float] = []
    start = time.perf_counter()
    while len(times) < least or time.perf_counter() - start < budget_s:
        t = clock()
        fn()
        times.append(clock() - t)
    return float(np.median(times))


def probe_forward(
    sizes: list[int], discrete: bool, normalize: bool = True, batches: tuple = ENV_BATCHES
) -> dict[int, float]:
    """Seconds per forward of a policy of layer ``sizes`` as an actor runs it (numpy, one
    thread, weights in the core's caches), by env count, on the thread's own clock."""
    from policies.numpy_policy import NumpyPolicy, random_state_arrays

    state = random_state_arrays(sizes, discrete)
    model = NumpyPolicy(discrete, normalize, *state, seed=0)
    rng = np.random.default_rng(0)
    out = {}
    for n in batches:
        obs = rng.standard_normal((n, sizes[0])).astype(np.float32)
        out[n] = timed(lambda o=obs: model.act(o), clock=time.thread_time)
    return out


POOL_ENVS = 16
"""Envs of the EnvPool instance the env-step probe times (one env would time EnvPool's hand-off
to its worker thread, not its step)."""


def probe_env_step(
    env_id: str, seed: int = 0, slices: int = 3, backend: str = "gymnasium"
) -> float:
    """CPU seconds per step of one env with random actions (resets included as they come):
    the least of ``slices`` slices that share ``PROBE_S``, each timed on this thread's own
    clock (not the process's other threads, and not time spent waiting for a core another
    process holds), so a moment of interference does not double the figure sizing builds on.
    With ``backend='envpool'``: per env step of a ``POOL_ENVS``-env EnvPool instance on one
    worker thread, on the process's clock (the step runs on EnvPool's thread)."""
    from runtime.env_backends import make_envs

    pool = backend == "envpool"
    k = POOL_ENVS if pool else 1
    clock = time.process_time if pool else time.thread_time
    envs = make_envs(env_id, backend, k, seed)
    try:
        envs.reset()
        space = envs.action_space()
        space.seed(seed)
        best = math.inf
        for _ in range(slices):
            steps, start = 0, clock()
            wall = time.perf_counter()
            while steps < 50 or time.perf_counter() - wall < PROBE_S / slices:
                envs.step(0, k, np.stack([space.sample() for _ in range(k)]))
                steps += k
            best = min(best, max(clock() - start, 1e-9) / steps)
        return best
    finally:
        envs.close()


ROUND_ENVS = (2, 16)
"""Env counts the loaded probe times an actor's round at (its fixed and per-env cost)."""


def _rounds_loaded(
    env_id: str,
    seed: int,
    barrier,
    results,
    seconds: float,
    sizes: list[int],
    discrete: bool,
    backend: str = "gymnasium",
) -> None:
    """One process of ``probe_rounds_loaded``: make the envs and a numpy policy of the run's
    layer sizes, wait for the others, then run an actor's rounds (each env stepped once, one
    policy forward over their observations) at each of ``ROUND_ENVS`` env counts."""
    from policies.numpy_policy import NumpyPolicy, random_state_arrays
    from runtime.env_backends import make_envs

    envs = make_envs(env_id, backend, max(ROUND_ENVS), seed * 100)
    obs = envs.reset()
    policy = NumpyPolicy(discrete, True, *random_state_arrays(sizes, discrete, seed), seed=seed)
    space = envs.action_space()
    low, high = (None, None) if discrete else (space.low, space.high)
    barrier.wait(timeout=120)
    out: dict[str, dict[int, float]] = {"cpu": {}, "wall": {}}
    for k in ROUND_ENVS:
        rounds, start, wall = 0, time.process_time(), time.perf_counter()
        while rounds < 5 or time.perf_counter() - wall < seconds / len(ROUND_ENVS):
            act, _ = policy.act(obs[:k])
            act = act if discrete else np.clip(act, low, high)
            obs[:k] = envs.step(0, k, act).obs
            rounds += 1
        out["cpu"][k] = max(time.process_time() - start, 1e-9) / rounds
        out["wall"][k] = max(time.perf_counter() - wall, 1e-9) / rounds
    results.put(out)
    envs.close()


def probe_rounds_loaded(
    env_id: str,
    procs: int,
    sizes: list[int],
    discrete: bool,
    seconds: float = 2 * LOADED_S,
    backend: str = "gymnasium",
) -> dict[str, dict[int, float]]:
    """Seconds per actor round (``k`` envs stepped, one forward of the run's policy) by env
    count ``k``, with one such actor on each of ``procs`` cores at once, started together (the
    median over them), on two clocks: ``cpu`` (the process's CPU seconds, EnvPool's worker
    threads included: what sizing builds on) and ``wall`` (as they passed: what an actor's
    output follows, waits of its own included). A MuJoCo step costs about 1.4x as much with
    every core of a 16-core host busy as alone; this times the forward under that load as well."""
    import multiprocessing as mp

    ctx = mp.get_context("spawn")  # no inherited NVML or torch state
    barrier, results = ctx.Barrier(procs), ctx.Queue()
    args = (barrier, results, seconds, sizes, discrete, backend)
    workers = [
        ctx.Process(target=_rounds_loaded, args=(env_id, i, *args), daemon=True)
        for i in range(procs)
    ]
    from runtime.actor_placement import one_blas_thread

    with one_blas_thread():  # as the actors start: numpy's BLAS on one thread each
        for w in workers:
            w.start()
    try:
        costs = [results.get(timeout=180) for _ in workers]
    except Exception:
        raise ProbeError(f"the loaded actor-round probe of {env_id!r} did not finish") from None
    finally:
        for w in workers:
            w.join(timeout=5)
            if w.is_alive():
                w.kill()
    return {
        clock: {k: float(np.median([c[clock][k] for c in costs])) for k in ROUND_ENVS}
        for clock in ("cpu", "wall")
    }
