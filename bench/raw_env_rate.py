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
import time

REPORT_S = 0.5


def _stepper(env_id: str, envs: int, seconds: float, seed: int, index: int, start, out) -> None:
    from runtime.envs import make_env

    batch = [make_env(env_id) for _ in range(envs)]
    for i, env in enumerate(batch):
        env.reset(seed=seed + i)
        env.action_space.seed(seed + i)
    start.wait()
    steps, t0 = 0, time.monotonic()
    last = t0
    while (now := time.monotonic()) - t0 < seconds:
        for env in batch:
            _, _, terminated, truncated, _ = env.step(env.action_space.sample())
            if terminated or truncated:
                env.reset()
        steps += envs
        if now - last >= REPORT_S:
            out.put((index, steps, None))
            last = now
    out.put((index, steps, time.monotonic() - t0))


def raw_step_rate(
    env_id: str, processes: int, envs_per_process: int, seconds: float, progress: str | None = None
) -> float:
    """Aggregate env steps/s of ``processes`` processes stepping random actions together."""
    from autotune.workflows.progress_log import ProgressLog

    ctx = mp.get_context("spawn")
    start, out = ctx.Barrier(processes + 1), ctx.Queue()
    procs = [
        ctx.Process(
            target=_stepper, args=(env_id, envs_per_process, seconds, 1000 * i, i, start, out)
        )
        for i in range(processes)
    ]
    for p in procs:
        p.start()
    log = ProgressLog(progress, every_s=0.0) if progress else None
    start.wait()
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
    for p in procs:
        p.join()
    if log:
        log.write(sum(counts), force=True)
        log.close()
    return float(sum(rates.values()))


def main() -> None:
    """The limit arm's process (its flags are set by ``bench/compare_arms.py``)."""
    import os

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--env", default="CartPole-v1")
    ap.add_argument("--processes", type=int, default=1, help="0: one per core")
    ap.add_argument("--envs-per-process", type=int, default=8)
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--progress", default=None, metavar="FILE", help="write a progress curve")
    a = ap.parse_args()
    if a.processes < 0 or a.envs_per_process < 1 or a.seconds <= 0:
        ap.error("--processes must be >= 0, --envs-per-process >= 1 and --seconds > 0")
    processes = a.processes or os.cpu_count() or 1
    rate = raw_step_rate(a.env, processes, a.envs_per_process, a.seconds, a.progress)
    print(json.dumps({"env": a.env, "processes": processes, "steps_per_s": rate}))


if __name__ == "__main__":
    main()
