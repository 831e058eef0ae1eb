"""Learning quality at equal env steps: this project beside its peers, several seeds, one machine.

    python -m bench.learning run --env Ant-v5 --steps 1000000 --seeds 0,1,2 --arms ours,sb3 \\
        --parallel 3 --config bench/exports/ant-export.json --out out/learning
    python -m bench.learning report --dir out/learning --at 1000000,3000000 \\
        --markdown out/learning/table.md --plot out/learning/returns.png

``run`` trains every (arm, seed) pair to ``--steps`` trained env steps, ``--parallel`` at a time,
in ``--arms`` order, each on its own slice of the cores (``sched_setaffinity``, which its
processes inherit; the first slices are one core larger when the cores do not divide evenly), each
writing a progress curve (``autotune/workflows/progress_log.py``). ``report`` reads the mean return of
the last 100 episodes at the first line reaching each ``--at`` step count, per seed, and gives
the mean, the min and the max over seeds. Speed is not compared here (parallel runs share the
machine); ``bench.compare`` does that.

Arms: ``ours`` (``autotune train``; ``--config`` an exported config, its actor count set to the
slice's cores; ``--ours-args`` adds train flags such as the learner's), ``sb3``
(``bench.peers.sb3_ppo``, the RL Zoo's MuJoCo settings) and ``cleanrl``
(``bench.peers.cleanrl_ppo``). Every arm gets the hidden sizes of ``--policy``.

Runs longer than one sitting: ``--max-wall-s`` stops every run after that many seconds; an
``ours`` run (``autotune train --checkpoint``) or an ``sb3`` run saves a checkpoint then, and
running the same command again (same ``--out``) skips the runs that reached ``--steps`` and
resumes the others from their checkpoints, appending to their progress curves. ``cleanrl``
cannot resume: a stopped ``cleanrl`` run starts again from the beginning.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from autotune.workflows.progress_log import read_progress, value_at_steps
from bench.peers.common import hidden_from_policy

ARMS = ("ours", "sb3", "cleanrl")


def run_command(
    arm: str, seed: int, cores: int, a: argparse.Namespace, progress: Path, out: Path
) -> list[str]:
    py = sys.executable
    if arm == "ours":
        cmd = [
            py,
            "-m",
            "autotune.cli",
            "train",
            "--env",
            a.env,
            "--steps",
            str(a.steps),
            "--seed",
            str(seed),
            "--policy",
            a.policy,
            "--actors",
            str(max(1, cores)),
            "--quiet",
            "--progress",
            str(progress),
            "--json",
            str(out),
        ]
        if a.max_wall_s:
            cmd += ["--max-wall-s", str(a.max_wall_s)]
        cmd += ["--checkpoint", str(checkpoint_dir(out))]
        return cmd + (["--config", str(a.config)] if a.config else []) + shlex.split(a.ours_args)
    peer = "sb3_ppo" if arm == "sb3" else "cleanrl_ppo"
    extra = ["--seconds", str(a.max_wall_s)] if a.max_wall_s else []
    extra += ["--rollout", str(a.peer_rollout)]
    if arm == "sb3":
        extra += ["--checkpoint", str(checkpoint_dir(out))]
    return [
        py,
        "-m",
        f"bench.peers.{peer}",
        "--env",
        a.env,
        "--num-envs",
        str(a.peer_envs or cores),
        "--net",
        hidden_from_policy(a.policy),
        "--total-steps",
        str(a.steps),
        "--seed",
        str(seed),
        "--device",
        a.peer_device,
        "--progress",
        str(progress),
        *extra,
    ]


def checkpoint_dir(result: Path) -> Path:
    """Where the run writing ``STEM.result.json`` keeps its checkpoint: ``STEM.checkpoint``."""
    return result.with_suffix("").with_suffix(".checkpoint")


def finished(out_dir: Path, stem: str, steps: int) -> bool:
    """Whether an earlier sitting's run ``stem`` reached ``steps`` trained steps."""
    doc, curve = out_dir / f"{stem}.json", out_dir / f"{stem}.progress.jsonl"
    if not doc.exists() or not curve.exists():
        return False
    rows = read_progress(curve)
    return (
        json.loads(doc.read_text()).get("returncode") == 0
        and bool(rows)
        and (rows[-1]["steps"] >= steps)
    )


def core_slices(parallel: int) -> list[list[int]]:
    """``parallel`` disjoint slices of this process's cores; the first ``len % parallel`` slices
    get one core more, so none is left idle (16 cores, 6 runs: 3,3,3,3,2,2)."""
    cores = sorted(os.sched_getaffinity(0))
    if parallel > len(cores):
        raise SystemExit(f"--parallel {parallel}: more runs at once than the {len(cores)} cores")
    size, extra = divmod(len(cores), parallel)
    out, start = [], 0
    for i in range(parallel):
        n = size + (i < extra)
        out.append(cores[start : start + n])
        start += n
    return out


def cmd_run(a: argparse.Namespace) -> int:
    arms = [x.strip() for x in a.arms.split(",") if x.strip()]
    bad = [x for x in arms if x not in ARMS]
    if bad or not arms:
        raise SystemExit(f"--arms: unknown {bad or 'nothing given'}; allowed {', '.join(ARMS)}")
    try:
        seeds = [int(s) for s in a.seeds.split(",")]
    except ValueError:
        raise SystemExit(f"--seeds {a.seeds!r}: expected integers, e.g. 0,1,2") from None
    if a.config and not Path(a.config).is_file():
        raise SystemExit(f"--config {a.config!r}: no such file")
    out_dir = Path(a.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    jobs = [(arm, seed) for arm in arms for seed in seeds]
    done = [j for j in jobs if finished(out_dir, f"{a.env}-{j[0]}-seed{j[1]}", a.steps)]
    if done:
        print(f"already at {a.steps} steps, skipped: {done}", flush=True)
    jobs = [j for j in jobs if j not in done]
    slices, running, failed = core_slices(a.parallel), {}, 0
    while jobs or running:
        free = [i for i in range(len(slices)) if i not in running]
        while jobs and free:
            (arm, seed), slot = jobs.pop(0), free.pop(0)
            stem = f"{a.env}-{arm}-seed{seed}"
            cmd = run_command(
                arm,
                seed,
                len(slices[slot]),
                a,
                out_dir / f"{stem}.progress.jsonl",
                out_dir / f"{stem}.result.json",
            )
            print(f"[{stem}] cores {slices[slot]}: {' '.join(cmd)}", flush=True)
            log = (out_dir / f"{stem}.log").open("a")  # every sitting's output
            cores = slices[slot]
            proc = subprocess.Popen(
                cmd,
                stdout=log,
                stderr=subprocess.STDOUT,
                preexec_fn=lambda c=cores: os.sched_setaffinity(0, c),
            )
            running[slot] = (stem, proc, log, time.time(), arm, seed, cmd)
        time.sleep(1.0)
        for slot, (stem, proc, log, t0, arm, seed, cmd) in list(running.items()):
            if proc.poll() is None:
                continue
            log.close()
            del running[slot]
            reached = finished_steps(out_dir / f"{stem}.progress.jsonl")
            failed += proc.returncode != 0
            doc = {
                "arm": arm,
                "seed": seed,
                "env": a.env,
                "steps": a.steps,
                "policy": a.policy,
                "command": cmd,
                "returncode": proc.returncode,
                "wall_s": time.time() - t0,
                "trained_steps": reached,
                "finished": proc.returncode == 0 and reached >= a.steps,
            }
            (out_dir / f"{stem}.json").write_text(json.dumps(doc, indent=2) + "\n")
            print(
                f"[{stem}] rc {proc.returncode} after {doc['wall_s']:.0f} s, "
                f"{reached} trained steps",
                flush=True,
            )
    return 1 if failed else 0


def finished_steps(curve: Path) -> int:
    try:
        rows = read_progress(curve)
    except (OSError, ValueError):
        return 0
    return rows[-1]["steps"] if rows else 0


def load_runs(root: Path) -> dict[tuple[str, str], dict[int, list[dict[str, Any]]]]:
    """``(env, arm) -> {seed: progress rows}`` for every finished run under ``root``."""
    runs: dict[tuple[str, str], dict[int, list[dict[str, Any]]]] = {}
    for path in sorted(root.rglob("*-seed*.json")):
        if path.name.endswith(".result.json"):
            continue
        doc = json.loads(path.read_text())
        progress = path.with_name(path.name.replace(".json", ".progress.jsonl"))
        if doc.get("arm") not in ARMS or not progress.exists():
            continue
        runs.setdefault((doc["env"], doc["arm"]), {})[doc["seed"]] = read_progress(progress)
    if not runs:
        raise SystemExit(f"no `bench.learning run` results under {root}")
    return runs


def summarise(runs: dict, at: list[int]) -> list[dict[str, Any]]:
    rows = []
    for (env, arm), seeds in runs.items():
        row: dict[str, Any] = {"env": env, "arm": arm, "seeds": sorted(seeds)}
        for n in at:
            values = [v for v in (value_at_steps(r, n) for r in seeds.values()) if v is not None]
            row[str(n)] = (
                None
                if not values
                else {
                    "mean": statistics.mean(values),
                    "min": min(values),
                    "max": max(values),
                    "n": len(values),
                }
            )
        rows.append(row)
    return rows


def markdown(rows: list[dict[str, Any]], at: list[int]) -> str:
    head = " | ".join(f"return at {n / 1e6:g}M (mean, min..max over seeds)" for n in at)
    out = [f"| env | arm | seeds | {head} |", "|---|---|---|" + "---|" * len(at)]
    for row in rows:
        cells = []
        for n in at:
            v = row[str(n)]
            cells.append(
                "not reached"
                if v is None
                else f"{v['mean']:,.0f} ({v['min']:,.0f}..{v['max']:,.0f}, n={v['n']})"
            )
        out.append(f"| {row['env']} | {row['arm']} | {len(row['seeds'])} | {' | '.join(cells)} |")
    return "\n".join(out) + "\n"


def plot(runs: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    envs = sorted({env for env, _ in runs})
    fig, axes = plt.subplots(1, len(envs), figsize=(5 * len(envs), 3.6), squeeze=False)
    for ax, env in zip(axes[0], envs, strict=True):
        for (e, arm), seeds in sorted(runs.items()):
            if e != env:
                continue
            for k, rows in enumerate(seeds.values()):
                pts = [(r["steps"] / 1e6, r["return"]) for r in rows if r.get("return") is not None]
                if pts:
                    ax.plot(
                        *zip(*pts, strict=True),
                        color=f"C{ARMS.index(arm)}",
                        lw=1,
                        label=arm if k == 0 else None,
                    )
        ax.set_title(env, fontsize=9)
        ax.set_xlabel("trained env steps (M)")
        ax.set_ylabel("mean return, last 100 episodes")
        ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def cmd_report(a: argparse.Namespace) -> int:
    try:
        at = [int(float(x)) for x in a.at.split(",")]
    except ValueError:
        raise SystemExit(f"--at {a.at!r}: expected step counts, e.g. 1000000,3000000") from None
    runs = load_runs(Path(a.dir))
    rows = summarise(runs, at)
    if a.markdown:
        Path(a.markdown).write_text(markdown(rows, at))
    if a.plot:
        plot(runs, Path(a.plot))
    print(json.dumps(rows, indent=2))
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=__doc__.split("\n", 1)[1],
    )
    sub = ap.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="train every (arm, seed) to --steps")
    run.add_argument("--env", default="Pendulum-v1")
    run.add_argument("--arms", default="ours,sb3")
    run.add_argument("--seeds", default="0,1,2")
    run.add_argument("--steps", type=int, default=1_000_000)
    run.add_argument("--parallel", type=int, default=1, help="runs at once, on disjoint cores")
    run.add_argument("--policy", default="auto:256:128:64:auto")
    run.add_argument("--config", default=None, metavar="FILE", help="ours: an exported config")
    run.add_argument("--peer-device", default="cpu", help="the peers' trainer device")
    run.add_argument(
        "--peer-envs",
        type=int,
        default=0,
        help="the peers' vector envs (0: one per core of the slice); fixed, the peers'"
        " rollouts keep one shape whatever slice a run gets",
    )
    run.add_argument(
        "--peer-rollout",
        type=int,
        default=2048,
        help="the peers' steps per rollout, all envs together (the RL Zoo's 2048)",
    )
    run.add_argument(
        "--ours-args", default="", help="more `autotune train` flags for ours, e.g. '--lr 3e-4'"
    )
    run.add_argument(
        "--max-wall-s",
        type=float,
        default=0.0,
        help="stop each run after this many seconds (0: none); run again to resume sb3 runs",
    )
    run.add_argument("--out", required=True)
    run.set_defaults(func=cmd_run)
    rep = sub.add_parser("report", help="returns at given step counts, and the curves")
    rep.add_argument("--dir", required=True)
    rep.add_argument("--at", default="1000000,3000000")
    rep.add_argument("--markdown", default=None, metavar="FILE")
    rep.add_argument("--plot", default=None, metavar="PNG")
    rep.set_defaults(func=cmd_report)
    a = ap.parse_args(argv)
    if a.command == "run" and (
        a.steps < 1 or a.parallel < 1 or a.max_wall_s < 0 or a.peer_envs < 0 or a.peer_rollout < 1
    ):
        ap.error(
            "--steps, --parallel and --peer-rollout must be >= 1, --max-wall-s >= 0 and "
            "--peer-envs >= 0"
        )
    return a.func(a)


if __name__ == "__main__":
    sys.exit(main())
