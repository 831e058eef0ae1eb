"""Trained steps/s (and steps/J) of ``autotune train`` beside the raw random-action step rate of
the same actor count, in one run on the same machine (``bench/end_to_end.py``).

    python -m bench end-to-end --env Ant-v5 --actors 15 --envs-per-actor 16 --steps 3000000 \\
        --batch-size 8192 --raw-seconds 20 --out out/e2e

The steady-state trained rate is the slope of trained steps over the middle of the run (after
start-up, before the drain); the whole-run rate includes process start-up and drain. Steps:
``e2e``; ``--with-cli-runs`` adds ``cartpole-defaults`` (``autotune train`` with the CLI's
defaults) and ``pendulum`` (Pendulum-v1 learning, continuous actions), each with its own
timeout. ``--trace`` runs instead one ``autotune train`` (``--train-args``) and prints the
trainers' and migrator's counters each second (``bench/trace_run.py``: ``--dump-at``,
``--cpu``, ``--cpu-warmup-s``).
"""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys
from pathlib import Path

from bench.suite import Step
from bench.workload import add_workload_args

NAME = "end-to-end"
HELP = "trained steps/s and steps/J of `autotune train` beside the raw limit, same run"

CLI_RUNS = {
    # name -> (timeout s, train flags)
    "cartpole-defaults": (120, []),
    "pendulum": (
        90,
        [
            "--env",
            "Pendulum-v1",
            "--steps",
            "300000",
            "--reward-scale",
            "0.1",
            "--gamma",
            "0.95",
            "--actors",
            "4",
        ],
    ),
}


def add_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--env", default="CartPole-v1")
    ap.add_argument("--actors", type=int, default=max(1, (os.cpu_count() or 2) - 1))
    add_workload_args(ap)
    ap.add_argument("--steps", type=int, default=200_000, help="trained env steps of the run")
    ap.add_argument("--raw-seconds", type=float, default=20.0)
    ap.add_argument("--trainer-device", default="auto")
    ap.add_argument(
        "--with-cli-runs", action="store_true", help=f"add the steps {', '.join(CLI_RUNS)}"
    )
    trace = ap.add_argument_group("--trace: one traced `autotune train` run instead")
    trace.add_argument("--trace", action="store_true")
    trace.add_argument("--train-args", default="", help="the traced run's `autotune train` flags")
    trace.add_argument("--trace-s", type=float, default=120.0, help="the trace's time estimate")
    trace.add_argument("--dump-at", type=float, default=None, help="SIGUSR1 every service at S s")
    trace.add_argument("--cpu", action="store_true", help="per-process CPU shares each second")
    trace.add_argument(
        "--cpu-warmup-s",
        type=float,
        default=10.0,
        help="seconds left out of the closing CPU means (default 10)",
    )


def check(ap: argparse.ArgumentParser, a: argparse.Namespace) -> None:
    if a.actors < 1 or a.steps < 1 or a.raw_seconds <= 0:
        ap.error("--actors and --steps must be >= 1 and --raw-seconds > 0")
    if a.trace and not a.train_args:
        ap.error("--trace needs --train-args '...' (the `autotune train` flags to trace)")


def cli_run(name: str, out: Path) -> dict:
    timeout, flags = CLI_RUNS[name]
    path = out / f"{name}.json"
    cmd = [sys.executable, "-m", "autotune.cli", "train", *flags, "--quiet", "--json", str(path)]
    print(" ".join(cmd), flush=True)
    try:
        rc = subprocess.run(cmd, timeout=timeout).returncode
    except subprocess.TimeoutExpired:
        rc = None
    doc = {"command": cmd, "returncode": rc, "json": str(path), "failed": rc != 0}
    if rc is None:
        doc["note"] = f"stopped after {timeout} s"
    return doc


def plan(a: argparse.Namespace):
    if a.trace:
        from bench.trace_run import trace

        argv = shlex.split(a.train_args)
        return [
            Step("trace", lambda: trace(argv, a.dump_at, a.cpu, a.cpu_warmup_s), a.trace_s)
        ], None

    def e2e() -> dict:
        from bench.end_to_end import measure

        doc = measure(a)
        print({k: v for k, v in doc.items() if k != "result"}, doc["result"]["return_mean"])
        return doc

    # the run's length is unknown before it starts: the raw seconds, start-up and a guess
    steps = [Step("e2e", e2e, a.raw_seconds + 200)]
    if a.with_cli_runs:
        out = Path(a.out)
        out.mkdir(parents=True, exist_ok=True)
        steps += [Step(n, lambda n=n: cli_run(n, out), CLI_RUNS[n][0] + 10) for n in CLI_RUNS]
    return steps, None
