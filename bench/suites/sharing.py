"""One machine, many jobs: the same jobs run one after the other, all at once with no daemon,
and all at once under the daemon, which shares the machine out (``bench/shared_machine.py``).

    python -m bench sharing --jobs ant@0+120,ant@30+180,humanoid@60+180 \\
        --plots out/sharing/plots --out out/sharing

The raw-stepping limit of ``--limit-env`` runs before each way and once at the end, so each
way is read against the limits on either side of it as well (the machine's speed can drift
between ways; a part run later may land on another host of the same kind). Each way starts
with an empty probe cache. The closing table gives the machine's trained steps per joule each
way over its whole span (start-up included), the same over the limits beside it, the ratios the
goals name (raw, and each way to its own limits), each job's steps/s, and whether any step was
lost. The plot shows each job's cores and steps/s over time under the daemon.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from types import SimpleNamespace

from bench.shared_machine import WAYS, joined, parse_jobs, run_way
from bench.suite import Step, print_table
from bench.suites.peers import WORKLOADS

NAME = "sharing"
HELP = "several jobs on one machine: one after the other, together, and under the daemon"
GOALS = {"daemon / together": 1.3, "daemon / sequential": 0.9}
SLACK_S = 20.0
"""A way's estimate past its jobs' spans (start-up is inside them; the last drain is not): on
an H200 16-core host the ways ended within 0-4 s of their spans."""
LIMIT_SLACK_S = 20.0
"""A limit's estimate past its seconds: its imports, the envs' start and its warm-up (12 s on
that host)."""


def add_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument(
        "--jobs",
        default="ant@0+120,ant@30+180,humanoid@60+180",
        help="WORKLOAD@START+SECONDS, comma-separated (workloads: "
        f"{', '.join(WORKLOADS)}, or a gymnasium id)",
    )
    ap.add_argument("--ways", default=",".join(WAYS), help=f"of {', '.join(WAYS)}")
    ap.add_argument("--limit-env", default="ant", help="workload of the limit before and after")
    ap.add_argument("--limit-s", type=float, default=60.0, help="seconds of each limit run")
    ap.add_argument("--plots", default=None, metavar="DIR", help="write the timeline plot here")
    ap.add_argument("--markdown", default=None, metavar="FILE", help="the tables, as markdown")


def check(ap: argparse.ArgumentParser, a: argparse.Namespace) -> None:
    try:
        a.specs = parse_jobs(a.jobs, WORKLOADS)
    except ValueError as exc:
        ap.error(f"--jobs: {exc}")
    a.way_list = [w.strip() for w in a.ways.split(",") if w.strip()]
    bad = [w for w in a.way_list if w not in WAYS]
    if bad or not a.way_list:
        ap.error(f"--ways: {bad or 'none given'}; allowed {', '.join(WAYS)}")


def _limit(a: argparse.Namespace, name: str) -> dict:
    from bench.compare import run_arm
    from bench.machine_meter import MachineMeter

    env, policy = WORKLOADS.get(a.limit_env, (a.limit_env, "auto"))
    ns = SimpleNamespace(
        env=env, policy=policy, seconds=a.limit_s, warmup_s=5.0, min_steps=0, peer_rollout=0
    )
    out = Path(a.out) / name.replace(":", "-")
    out.mkdir(parents=True, exist_ok=True)
    meter = MachineMeter().start()
    try:
        return run_arm("limit", ns, meter, out)
    finally:
        meter.stop()


def plan(a: argparse.Namespace):
    """The limit before each way and once at the end, so each way is also read against the
    limits on either side of it (a machine whose speed drifts between ways shows there)."""
    spans = [s.start_s + s.seconds for s in a.specs]
    steps = []
    for way in a.way_list:
        name = f"limit:{way}"
        steps.append(Step(name, lambda n=name: _limit(a, n), a.limit_s + LIMIT_SLACK_S))
        if way == "sequential":  # one step per job, so a part need not hold them all
            for i, spec in enumerate(a.specs):
                run = lambda s=spec, first=i == 0: run_way(  # noqa: E731
                    [s], "sequential", Path(a.out) / "sequential", fresh_cache=first
                )
                steps.append(Step(f"sequential:{spec.name}", run, spec.seconds + SLACK_S))
            continue
        run = lambda w=way: run_way(a.specs, w, Path(a.out) / w)  # noqa: E731
        steps.append(Step(way, run, max(spans) + SLACK_S))
    steps.append(Step("limit-end", lambda: _limit(a, "limit-end"), a.limit_s + LIMIT_SLACK_S))

    def finish(results: dict) -> None:
        from bench.sharing_report import plot_timeline, table

        seq = [f"sequential:{s.name}" for s in a.specs]
        if "sequential" in a.way_list and all(k in results for k in seq):
            results = {**results, "sequential": joined([results[k] for k in seq])}
        print_table(lambda r: table(r, GOALS, a.way_list), a.markdown)(results)
        if a.plots and "daemon" in results:
            path = plot_timeline(results["daemon"], Path(a.plots) / "sharing-daemon.png")
            print(f"plot: {path}")

    return steps, finish
