"""The physical limit: random-action env stepping on N processes, no learning, no transport.

python -m bench.raw_env_rate --env Ant-v5 --processes 15 --envs-per-process 16 --seconds 20
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import time

import numpy as np


def _stepper(env_id: str, envs: int, seconds: float, seed: int, start, out) -> None:
    from runtime.envs import make_env

    batch = [make_env(env_id) for _ in range(envs)]
    for i, env in enumerate(batch):
        env.reset(seed=seed + i)
        env.action_space.seed(seed + i)
    start.wait()
    steps, t0 = 0, time.monotonic()
    while time.monotonic() - t0 < seconds:
        for env in batch:
            _, _, terminated, truncated, _ = env.step(env.action_space.sample())
            if terminated or truncated:
                env.reset()
        steps += envs
    out.put((steps, time.monotonic() - t0))


def raw_step_rate(env_id: str, processes: int, envs_per_process: int, seconds: float) -> float:
    """Aggregate env steps/s of ``processes`` processes stepping random actions together."""
    ctx = mp.get_context("spawn")
    start, out = ctx.Barrier(processes + 1), ctx.Queue()
    procs = [ctx.Process(target=_stepper, args=(env_id, envs_per_process, seconds, 1000 * i,
                                                start, out)) for i in range(processes)]  # fmt: skip
    for p in procs:
        p.start()
    start.wait()
    results = [out.get(timeout=seconds + 120) for _ in procs]
    for p in procs:
        p.join()
    return float(np.sum([s / t for s, t in results]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--env", default="CartPole-v1")
    ap.add_argument("--processes", type=int, default=1)
    ap.add_argument("--envs-per-process", type=int, default=8)
    ap.add_argument("--seconds", type=float, default=5.0)
    a = ap.parse_args()
    rate = raw_step_rate(a.env, a.processes, a.envs_per_process, a.seconds)
    print(json.dumps({"env": a.env, "processes": a.processes, "steps_per_s": rate}))


if __name__ == "__main__":
    main()
