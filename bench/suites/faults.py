"""Training through faults: each role's process SIGKILLed partway through a run, beside an
unfaulted run of the same length (``bench/fault_recovery.py``).

    python -m bench faults --env CartPole-v1 --seconds 40 --kill-at-s 15 --out out/faults

One step per role (``none`` is the unfaulted run, and runs first): ``actor`` (restarted),
``compressor`` and ``migrator`` (the pipeline and every actor replaced), ``trainer`` (a new GMI
generation from the lead GMI's recovery state; it is killed once that state exists, so at
``--kill-at-s`` or after the first recovery save). The closing table gives, per fault, the
steps trained after it against what the unfaulted run trained over the same span.
"""

from __future__ import annotations

import argparse

from bench.fault_recovery import ROLES, compare, fault_run, table
from bench.suite import Step

NAME = "faults"
HELP = "training through a SIGKILL of each role, beside an unfaulted run"


def add_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--env", default="CartPole-v1")
    ap.add_argument("--seconds", type=float, default=40.0, help="wall of every run")
    ap.add_argument("--kill-at-s", type=float, default=15.0, help="when the fault comes")
    ap.add_argument("--roles", default=",".join(ROLES), help=f"of {', '.join(ROLES)}")
    ap.add_argument("--actors", type=int, default=2)
    ap.add_argument("--envs-per-actor", type=int, default=8)
    ap.add_argument("--batch-size", type=int, default=1024)


def check(ap: argparse.ArgumentParser, a: argparse.Namespace) -> None:
    a.role_list = [r.strip() for r in a.roles.split(",") if r.strip()]
    bad = [r for r in a.role_list if r not in ROLES]
    if bad or "none" not in a.role_list:
        ap.error(f"--roles: {bad or 'none is missing'}; allowed {', '.join(ROLES)}, with none")
    if not 0 < a.kill_at_s < a.seconds:
        ap.error("--kill-at-s must lie inside the run: 0 < --kill-at-s < --seconds")
    a.role_list.remove("none")
    a.role_list.insert(0, "none")


def plan(a: argparse.Namespace):
    cfg = {"actors": a.actors, "envs_per_actor": a.envs_per_actor, "batch_size": a.batch_size}
    steps = [
        Step(
            role, lambda r=role: fault_run(a.env, r, a.seconds, a.kill_at_s, **cfg), a.seconds + 60
        )
        for role in a.role_list
    ]

    def finish(results: dict) -> None:
        print(table(compare(results)))

    return steps, finish
