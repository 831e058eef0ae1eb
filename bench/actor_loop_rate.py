"""An actor's own loop against raw stepping, on every core at once: where an actor's CPU goes.

A sized run's actors can each use a whole core and still step slower than the raw-stepping
limit's processes do (Humanoid-v5 on a 16-core host: 0.80 ms of CPU per env step in the run,
0.47 ms in the raw loop). This runs, on ``--processes`` processes at once (0: every core), one of:

* ``raw``: random actions through the same env wrapper (``runtime.env_backends``), as the limit;
* ``collect``: the run's real ``runtime.actor.Actor.collect`` (the policy forward on the actor's
  core, action clipping, the episode bookkeeping, the finite checks, the rollout buffers), with
  fixed version-0 weights and nothing sent: the actor without the pipeline around it.

Each process reports its env steps, wall seconds and CPU seconds (``time.process_time``, all its
threads: EnvPool's worker thread included). Should ``collect`` match ``raw``, what a run adds is
the pipeline (dispatch, receipts, weights); should it not, the loop itself.

An env's step can cost more in some states than in others (Humanoid-v5 with the body upright
for longer, a learning policy's longer episodes, against random actions' falls): ``--weights``
gives ``collect`` a learner state (a run's checkpoint) to act with, so its states are a learning
run's, and each loop reports its mean episode length beside its cost.

    python -m bench.actor_loop_rate --env Humanoid-v5 --loops raw,collect --envs-per-actor 64 \\
        --seconds 15 --json out/actor-loop.json
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import queue
import time
from typing import Any

from runtime.actor_placement import one_blas_thread

LOOPS = ("raw", "collect")


class _FixedWeights:
    """What ``runtime.policy_io.LocalPolicy`` reads of a weights receiver: version 0, never new."""

    def __init__(self, model: Any) -> None:
        self.model, self.version = model, 0

    def poll(self, timeout_ms: int = 0) -> None:
        return None


class _Counter:
    value = 0


def _loop(args: dict[str, Any], index: int, start: Any, out: Any) -> None:
    # numpy loaded as this process unpickled its arguments (a learner state's arrays), with
    # the BLAS threads its environment gave it then: run_loop starts it with one
    blas = os.environ.get("OPENBLAS_NUM_THREADS")
    from policies.actor_critic import initial_state_arrays
    from policies.numpy_policy import NumpyPolicy
    from runtime.actor import Actor
    from runtime.config import TrainConfig
    from runtime.env_backends import make_envs
    from runtime.envs import probe_env
    from runtime.policy_io import LocalPolicy

    env, k, backend = args["env"], args["envs_per_actor"], args["backend"]
    info = probe_env(env, backend)
    ended = [0]
    if args["loop"] == "collect":
        cfg = TrainConfig(env=env, env_backend=backend, envs_per_actor=k, actors=args["actors"])
        if args.get("state") is not None:  # a learner state's policy, read once by run_loop
            state = args["state"]
        else:
            state = initial_state_arrays(
                info.obs_dim, info.act_dim, info.discrete, args["policy"], True, 0
            )
        model = NumpyPolicy(info.discrete, True, *state, seed=index)
        policy = LocalPolicy(_FixedWeights(model))
        actor = Actor(cfg, info, index, 0, None, policy, None, None, _Counter())
        per = k * cfg.rollout_len

        def step() -> None:
            actor.collect()
            ended[0] += len(actor.episodes)
            actor.episodes.clear()

    else:
        from bench.raw_env_rate import action_sampler

        vec = make_envs(env, backend, k, index * 1000, 1)
        vec.reset()
        draw = action_sampler(vec.action_space(), k, index)

        def step() -> None:
            ended[0] += len(vec.step(0, k, draw()).final_obs)

        per = k
    step()  # warm
    start.wait()
    ended[0] = 0
    steps, t0, c0, u0 = 0, time.monotonic(), time.process_time(), time.time()
    while time.monotonic() - t0 < args["seconds"]:
        step()
        steps += per
    wall, cpu = time.monotonic() - t0, time.process_time() - c0
    out.put((index, steps, wall, cpu, ended[0], u0, time.time(), blas))


def learned_state_arrays(path: str) -> tuple[list[str], list]:
    """The policy of a learner state file (a checkpoint's ``learner.pt``, read with
    ``torch.load(weights_only=True)``), as ``state_arrays``."""
    from runtime.learner_state import load_state

    model = load_state(path)["model"]
    return list(model), [t.detach().cpu().numpy() for t in model.values()]


def run_loop(args: dict[str, Any], processes: int) -> dict[str, Any]:
    """``processes`` processes of ``args['loop']`` at once; their summed rates."""
    if args["loop"] == "collect" and args.get("weights"):  # read here, not in every process
        args = {**args, "state": learned_state_arrays(args["weights"])}
    ctx = mp.get_context("spawn")
    start, out = ctx.Barrier(processes), ctx.Queue()
    procs = [ctx.Process(target=_loop, args=(args, i, start, out)) for i in range(processes)]
    with one_blas_thread():  # an actor's one thread: a thread per core each would spin them
        for p in procs:
            p.start()
    rows: list[tuple] = []
    deadline = time.monotonic() + args["seconds"] + 300
    while len(rows) < processes:
        try:
            rows.append(out.get(timeout=1.0))
        except queue.Empty:
            dead = [p.exitcode for p in procs if p.exitcode not in (None, 0)]
            if dead or time.monotonic() > deadline:
                for p in procs:
                    p.kill()
                why = f"exited {dead[0]}" if dead else "did not finish in time"
                msg = f"a {args['loop']} process {why} (its traceback is above)"
                raise SystemExit(msg) from None
    for p in procs:
        p.join()
    steps = sum(r[1] for r in rows)
    wall = max(r[2] for r in rows)
    cpu = sum(r[3] for r in rows)
    episodes = sum(r[4] for r in rows)
    return {
        "loop": args["loop"],
        "weights": args.get("weights") if args["loop"] == "collect" else None,
        "episode_len": round(steps / episodes, 1) if episodes else None,
        "processes": processes,
        "steps_per_s": steps / wall,
        "steps_per_s_per_process": steps / wall / processes,
        "cpu_ms_per_step": 1e3 * cpu / steps,
        "blas_threads": sorted({r[7] for r in rows}, key=str),  # each process's, at its start
        "started_unix": min(r[5] for r in rows),  # the measured span, for a meter read beside
        "ended_unix": max(r[6] for r in rows),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--env", required=True)
    ap.add_argument("--backend", default="envpool", choices=("gymnasium", "envpool"))
    ap.add_argument("--policy", default="auto:400:200:100:auto", help="the actors' MLP")
    ap.add_argument("--loops", default="raw,collect", help=f"of {', '.join(LOOPS)}")
    ap.add_argument("--envs-per-actor", type=int, default=64)
    ap.add_argument("--processes", type=int, default=0, help="0: every core")
    ap.add_argument("--seconds", type=float, default=15.0)
    ap.add_argument(
        "--weights",
        metavar="LEARNER_PT",
        help="collect acts with this learner state's policy (a checkpoint's learner.pt) "
        "instead of the version-0 weights: the states a learning run steps through",
    )
    ap.add_argument("--json", help="where the result goes")
    a = ap.parse_args(argv)
    loops = [x for x in a.loops.split(",") if x]
    bad = [x for x in loops if x not in LOOPS]
    if bad or not loops:
        ap.error(f"--loops {a.loops!r}: allowed are {', '.join(LOOPS)}")
    if a.envs_per_actor < 1 or a.seconds <= 0 or a.processes < 0:
        ap.error("--envs-per-actor must be >= 1, --seconds > 0, --processes >= 0")
    if a.weights:
        from runtime.learner_state import StateError

        try:
            learned_state_arrays(a.weights)
        except StateError as exc:
            ap.error(f"--weights: {exc}")
    from runtime.env_backends import resolve_backend
    from runtime.envs import EnvError, probe_env

    try:  # an env that cannot be made fails here, not in every child
        probe_env(a.env, resolve_backend(a.env, a.backend))
    except EnvError as exc:
        ap.error(str(exc))
    n = a.processes or len(os.sched_getaffinity(0))
    results = []
    for loop in loops:
        args = {
            "env": a.env,
            "backend": a.backend,
            "policy": a.policy,
            "loop": loop,
            "envs_per_actor": a.envs_per_actor,
            "actors": n,
            "seconds": a.seconds,
            "weights": a.weights,
        }
        results.append(run_loop(args, n))
        print(json.dumps(results[-1]), flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"env": a.env, "backend": a.backend, "results": results}, f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
