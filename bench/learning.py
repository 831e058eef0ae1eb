"""The runs of ``python -m bench learning``: their command lines, cores, resumption and report.

Every (arm, seed) trains to ``--steps`` on its own slice of the cores, writing a progress curve
(``autotune/workflows/progress_log.py``); the report reads the mean return of the last 100
episodes at the first line reaching each ``--at`` step count.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from autotune.workflows.progress_log import read_progress, value_at_steps
from bench.compare_arms import MIN_STEPS_WALL_FACTOR
from bench.peers.common import hidden_from_policy
from bench.report import write_json

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
        if a.max_wall_s:  # with --min-steps a safety net: run_all stops it with Ctrl-C
            wall = a.max_wall_s * (MIN_STEPS_WALL_FACTOR if a.min_steps else 1)
            cmd += ["--max-wall-s", str(wall)]
        cmd += ["--checkpoint", str(checkpoint_dir(out))]
        return cmd + (["--config", str(a.config)] if a.config else []) + shlex.split(a.ours_args)
    peer = "sb3_ppo" if arm == "sb3" else "cleanrl_ppo"
    extra = ["--seconds", str(a.max_wall_s)] if a.max_wall_s else []
    extra += ["--min-steps", str(a.min_steps)] if a.max_wall_s and a.min_steps else []
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
    """Whether an earlier part's run ``stem`` reached ``steps`` trained steps."""
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


def run_all(a: argparse.Namespace, arms: list[str], seeds: list[int]) -> list[dict[str, Any]]:
    """Runs every (arm, seed) not yet at ``a.steps``; returns the documents of those it ran."""
    out_dir = Path(a.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    jobs = [(arm, seed) for arm in arms for seed in seeds]
    done = [j for j in jobs if finished(out_dir, f"{a.env}-{j[0]}-seed{j[1]}", a.steps)]
    if done:
        print(f"already at {a.steps} steps, skipped: {done}", flush=True)
    jobs = [j for j in jobs if j not in done]
    slices, running, docs, stopped = core_slices(a.parallel), {}, [], set()
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
            log = (out_dir / f"{stem}.log").open("a")  # every part's output
            cores = slices[slot]
            proc = subprocess.Popen(
                cmd,
                stdout=log,
                stderr=subprocess.STDOUT,
                preexec_fn=lambda c=cores: os.sched_setaffinity(0, c),
            )
            start = finished_steps(out_dir / f"{stem}.progress.jsonl")
            running[slot] = (stem, proc, log, time.time(), arm, seed, cmd, start)
        time.sleep(1.0)
        for slot, (stem, proc, log, t0, arm, seed, cmd, start) in list(running.items()):
            if proc.poll() is None:
                curve = out_dir / f"{stem}.progress.jsonl"
                if arm == "ours" and proc.pid not in stopped and _part_done(a, t0, curve, start):
                    proc.send_signal(signal.SIGINT)  # once: it drains and saves its checkpoint
                    stopped.add(proc.pid)
                continue
            log.close()
            del running[slot]
            reached = finished_steps(out_dir / f"{stem}.progress.jsonl")
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
            write_json(out_dir / f"{stem}.json", doc)
            docs.append(doc)
            print(
                f"[{stem}] rc {proc.returncode} after {doc['wall_s']:.0f} s, "
                f"{reached} trained steps",
                flush=True,
            )
    return docs


def _part_done(a: argparse.Namespace, t0: float, curve: Path, start: int) -> bool:
    """Whether a run given ``--min-steps`` has passed ``--max-wall-s`` and trained that many
    steps since it started at ``start``."""
    if not (a.max_wall_s and a.min_steps) or time.time() - t0 < a.max_wall_s:
        return False
    return finished_steps(curve) >= start + a.min_steps


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
        raise SystemExit(f"no `python -m bench learning` results under {root}")
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


def report(root: Path, at: list[int], markdown_path: str | None, plot_path: str | None) -> list:
    """Returns at the step counts ``at`` per (env, arm), over seeds; the table and the plot."""
    runs = load_runs(root)
    rows = summarise(runs, at)
    if markdown_path:
        Path(markdown_path).write_text(markdown(rows, at))
    if plot_path:
        plot(runs, Path(plot_path))
    print(json.dumps(rows, indent=2))
    return rows
