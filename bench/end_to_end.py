"""Trained steps/s of the whole pipeline beside the raw random-action step rate, same run.

    python -m bench end-to-end --env Ant-v5 --actors 15 --envs-per-actor 16 --steps 3000000

Runs, in order on the same machine: (1) raw random-action stepping on ``--actors`` processes,
(2) ``autotune train`` with the same actor count through the four stages. The steady-state
trained rate is the slope of trained steps over the middle of the run (after start-up, before
the drain); the whole-run rate includes process start-up and drain.
"""

from __future__ import annotations

import argparse
import os
import platform
import time

from bench.raw_env_rate import raw_step_rate
from bench.workload import learner_from_args
from runtime.config import TrainConfig
from runtime.runner import Runner, RunState


def steady_rate(samples: list[tuple[float, int]], lo: float = 0.3, hi: float = 0.9) -> float:
    """Slope of trained steps over time between fractions ``lo`` and ``hi`` of the steps."""
    total = samples[-1][1]
    inner = [(t, s) for t, s in samples if lo * total <= s <= hi * total]
    if len(inner) < 2 or inner[-1][0] <= inner[0][0]:
        return 0.0
    return (inner[-1][1] - inner[0][1]) / (inner[-1][0] - inner[0][0])


def measure(a: argparse.Namespace) -> dict:
    """The raw rate, then the trained run with the same actors; both rates and their ratios."""
    raw = raw_step_rate(a.env, a.actors, a.envs_per_actor, a.raw_seconds)
    cfg = TrainConfig(
        env=a.env,
        steps=a.steps,
        actors=a.actors,
        envs_per_actor=a.envs_per_actor,
        rollout_len=a.rollout_len,
        batch_size=a.batch_size,
        policy=a.policy,
        trainer_device=a.trainer_device,
        learner=learner_from_args(a),
    )
    info = cfg.validate()
    samples: list[tuple[float, int]] = []

    def record(state: RunState) -> None:
        if not state.draining:
            samples.append((state.elapsed_s, state.trained_steps))

    t0 = time.time()
    result = Runner(cfg, info, on_progress=record).run()
    steady = steady_rate(samples)
    doc = {
        "date": time.strftime("%Y-%m-%d", time.gmtime(t0)),
        "host": platform.node(),
        "cpus": os.cpu_count(),
        "env": a.env,
        "actors": a.actors,
        "envs_per_actor": a.envs_per_actor,
        "raw_steps_per_s": raw,
        "trained_steps_per_s_steady": steady,
        "trained_steps_per_s_whole_run": result["steps_per_s"],
        "ratio_steady_to_raw": steady / raw if raw else None,
        "ratio_whole_run_to_raw": result["steps_per_s"] / raw if raw else None,
        "result": result,
    }
    return doc
