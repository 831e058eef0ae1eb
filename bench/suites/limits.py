"""The physical limit: random-action env stepping on N processes (no learning, no transport,
GPU left without a CUDA context); and what holding the GPU costs before any work (its mean
power with no context, with one idle context, and with one through MPS).

    python -m bench limits --env Ant-v5 --processes 16 --envs-per-process 16 --seconds 20 \\
        --idle-s 15 --out out/limits

Steps: ``raw`` (``bench/raw_env_rate.py``, on each env backend that has the env: the limit is
the faster's) and ``gpu-idle`` (``bench/gpu_idle_power.py``,
needs a GPU that NVML reads; skipped, saying so, without one). ``--only`` picks some.
"""

from __future__ import annotations

import argparse
import os

from bench.suite import Step

NAME = "limits"
HELP = "raw env stepping (the physical limit) and the GPU's idle / context power"
STEPS = ("raw", "gpu-idle")


def add_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--only", default=",".join(STEPS), help=f"steps to run, of {', '.join(STEPS)}")
    ap.add_argument("--env", default="CartPole-v1")
    ap.add_argument("--processes", type=int, default=1, help="raw: processes (0: one per core)")
    ap.add_argument("--envs-per-process", type=int, default=8)
    ap.add_argument("--seconds", type=float, default=5.0, help="raw: seconds of stepping")
    ap.add_argument("--idle-s", type=float, default=15.0, help="gpu-idle: seconds per phase")
    ap.add_argument(
        "--settle-s",
        type=float,
        default=5.0,
        help="gpu-idle: seconds after a context opens (or closes) before charging",
    )
    ap.add_argument("--no-mps", action="store_true", help="gpu-idle: leave out the MPS phase")


def check(ap: argparse.ArgumentParser, a: argparse.Namespace) -> None:
    a.only = [x.strip() for x in a.only.split(",") if x.strip()]
    bad = [x for x in a.only if x not in STEPS]
    if bad or not a.only:
        ap.error(f"--only: unknown {bad or 'nothing given'}; allowed {', '.join(STEPS)}")
    if a.processes < 0 or a.envs_per_process < 1 or a.seconds <= 0:
        ap.error("--processes must be >= 0, --envs-per-process >= 1 and --seconds > 0")
    if not a.idle_s > 0 or a.settle_s < 0:
        ap.error(f"--idle-s {a.idle_s} must be > 0 and --settle-s {a.settle_s} >= 0")


def raw(a: argparse.Namespace) -> dict:
    """Each env backend that has the env (gymnasium; EnvPool where installed), one after the
    other; the limit is the faster's."""
    from bench.raw_env_rate import raw_step_rate
    from runtime.env_backends import envpool_ids

    processes = a.processes or os.cpu_count() or 1
    backends = ["gymnasium"] + (["envpool"] if a.env in envpool_ids() else [])
    rates = {
        b: raw_step_rate(a.env, processes, a.envs_per_process, a.seconds, None, b) for b in backends
    }
    fastest = max(rates, key=rates.__getitem__)
    return {
        "env": a.env,
        "processes": processes,
        "by_backend": rates,
        "backend": fastest,
        "steps_per_s": rates[fastest],
    }


def gpu_idle(a: argparse.Namespace) -> dict:
    from bench.gpu_idle_power import measure

    rows = measure(a.idle_s, a.settle_s, not a.no_mps)
    for name, value in rows.items():
        print(f"{name:26s} {value}")
    return {"seconds": a.idle_s, "settle_s": a.settle_s, "mean_w": rows}


def plan(a: argparse.Namespace):
    steps = {
        "raw": Step("raw", lambda: raw(a), 2 * a.seconds + 60),
        "gpu-idle": Step(
            "gpu-idle", lambda: gpu_idle(a), 4 * a.idle_s + 5 * a.settle_s + 30, needs_gpu=True
        ),
    }
    return [steps[n] for n in STEPS if n in a.only], None
