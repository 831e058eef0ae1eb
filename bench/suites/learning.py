"""Learning quality at equal env steps: this project beside Stable-Baselines3 PPO (and CleanRL),
several seeds, one machine; then the returns at given step counts and the curves.

    python -m bench learning --env Ant-v5 --steps 3000000 --seeds 0,1,2 --arms ours,sb3 \\
        --parallel 6 --peer-envs 2 --max-wall-s 500 --at 1000000,3000000 \\
        --markdown out/learning/table.md --plot out/learning/returns.png \\
        --state st --part-s 590 --out out/learning

Step ``runs`` trains every (arm, seed) pair to ``--steps`` trained env steps, ``--parallel`` at
a time, in ``--arms`` order, each on its own slice of the cores (``sched_setaffinity``, which its
processes inherit; the first slices are one core larger when the cores do not divide evenly),
each writing a progress curve under ``--out``. Step ``report`` reads the mean return of the last
100 episodes at the first line reaching each ``--at`` step count, per seed, and gives the mean,
the min and the max over seeds. Speed is not compared here (parallel runs share the machine);
the ``peers`` suite does that.

Arms: ``ours`` (``autotune train``; ``--config`` an exported config, its actor count set to the
slice's cores; ``--ours-args`` adds train flags such as the learner's), ``sb3``
(``bench/peers/sb3_ppo.py``, the RL Zoo's MuJoCo settings) and ``cleanrl``
(``bench/peers/cleanrl_ppo.py``). Every arm gets the hidden sizes of ``--policy``.

Runs longer than one command: ``--max-wall-s`` stops every run after that many seconds (with
``--min-steps N``, not before it trained N steps in that command); an
``ours`` run (``autotune train --checkpoint``) or an ``sb3`` run saves a checkpoint then, the
``runs`` step is left unfinished, and running the same command again (same ``--out``) skips the
runs that reached ``--steps`` and resumes the others from their checkpoints, appending to their
progress curves. ``cleanrl`` cannot resume: a stopped ``cleanrl`` run starts again.
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

from bench.suite import NotFinished, Step

NAME = "learning"
HELP = "learning curves vs Stable-Baselines3 PPO (and CleanRL) at equal env steps"
ARMS = ("ours", "sb3", "cleanrl")
PARTS = ("runs", "report")


def add_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--only", default="runs,report", help="runs, report or both")
    ap.add_argument("--env", default="Pendulum-v1")
    ap.add_argument("--arms", default="ours,sb3")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--steps", type=int, default=1_000_000)
    ap.add_argument("--parallel", type=int, default=1, help="runs at once, on disjoint cores")
    ap.add_argument("--policy", default="auto:256:128:64:auto")
    ap.add_argument("--config", default=None, metavar="FILE", help="ours: an exported config")
    ap.add_argument("--peer-device", default="cpu", help="the peers' trainer device")
    ap.add_argument(
        "--peer-envs",
        type=int,
        default=0,
        help="the peers' vector envs (0: one per core of the slice); fixed, the peers'"
        " rollouts keep one shape whatever slice a run gets",
    )
    ap.add_argument(
        "--peer-rollout",
        type=int,
        default=2048,
        help="the peers' steps per rollout, all envs together (the RL Zoo's 2048)",
    )
    ap.add_argument(
        "--ours-args", default="", help="more `autotune train` flags for ours, e.g. '--lr 3e-4'"
    )
    ap.add_argument(
        "--max-wall-s",
        type=float,
        default=0.0,
        help="stop each run after this many seconds (0: none); run again to resume sb3 runs",
    )
    ap.add_argument(
        "--min-steps",
        type=int,
        default=0,
        help="with --max-wall-s, each run goes on past it until it trained this many steps in "
        "this command (ours is then stopped with Ctrl-C and saves; a peer stops itself): a "
        "loaded machine gets longer parts, not empty ones",
    )
    ap.add_argument("--at", default="1000000,3000000", help="report: step counts")
    ap.add_argument("--markdown", default=None, metavar="FILE", help="report: the table")
    ap.add_argument("--plot", default=None, metavar="PNG", help="report: the curves")


def check(ap: argparse.ArgumentParser, a: argparse.Namespace) -> None:
    if a.steps < 1 or a.parallel < 1 or a.peer_rollout < 1:
        ap.error("--steps, --parallel and --peer-rollout must be >= 1")
    if min(a.max_wall_s, a.peer_envs, a.min_steps) < 0:
        ap.error("--max-wall-s, --peer-envs and --min-steps must be >= 0")
    a.only = [x.strip() for x in a.only.split(",") if x.strip()]
    bad = [x for x in a.only if x not in PARTS]
    if bad or not a.only:
        ap.error(f"--only: unknown {bad or 'nothing given'}; allowed {', '.join(PARTS)}")
    try:
        a.at_steps = [int(float(x)) for x in a.at.split(",")]
    except ValueError:
        raise SystemExit(f"--at {a.at!r}: expected step counts, e.g. 1000000,3000000") from None
    if "runs" not in a.only:
        return
    a.arm_list = [x.strip() for x in a.arms.split(",") if x.strip()]
    bad = [x for x in a.arm_list if x not in ARMS]
    if bad or not a.arm_list:
        raise SystemExit(f"--arms: unknown {bad or 'nothing given'}; allowed {', '.join(ARMS)}")
    try:
        a.seed_list = [int(s) for s in a.seeds.split(",")]
    except ValueError:
        raise SystemExit(f"--seeds {a.seeds!r}: expected integers, e.g. 0,1,2") from None
    if a.config and not Path(a.config).is_file():
        raise SystemExit(f"--config {a.config!r}: no such file")
    from bench.learning import core_slices

    core_slices(a.parallel)  # refuses more runs at once than cores


def runs(a: argparse.Namespace) -> dict:
    from bench.learning import run_all

    docs = run_all(a, a.arm_list, a.seed_list)
    result = {"runs": docs, "failed": any(d["returncode"] != 0 for d in docs)}
    unfinished = [f"{d['arm']}-seed{d['seed']}" for d in docs if not d["finished"]]
    if unfinished and not result["failed"]:
        raise NotFinished(
            result,
            f"{', '.join(unfinished)} not yet at {a.steps} steps; they go on from their "
            "checkpoints when the same command runs again",
        )
    return result


def report(a: argparse.Namespace) -> list:
    from bench.learning import report as make

    return make(Path(a.out), a.at_steps, a.markdown, a.plot)


def plan(a: argparse.Namespace):
    steps = []
    if "runs" in a.only:
        jobs = len(a.arm_list) * len(a.seed_list)
        waves = math.ceil(jobs / a.parallel)
        estimate = (a.max_wall_s + 60) * waves if a.max_wall_s else 3600.0
        steps.append(Step("runs", lambda: runs(a), estimate))
    if "report" in a.only:
        steps.append(Step("report", lambda: report(a), 30))
    return steps, None
