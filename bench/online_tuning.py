"""The online-tuning arms of ``python -m bench tuning``: each a real ``autotune train`` run, the
way a user starts it, and the report that sets them side by side.

Figures (``report``): steps/J of the tuned run's final third (from the run timelines: every
trained step and joule in that span, transitions and re-checks included), of the default run
after its first ``--skip-s`` seconds, and of the grid's best window. The plot shows steps/J per
tuning window and the knobs over time.
"""

from __future__ import annotations

import argparse
import json
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from runtime.results import timeline_rate

FIXED = [
    "trainers=1",
    "chunk_bytes=262144",
    "trainer_threads=1",
    "trainer_device=cuda",
    "inference=actor",
    "rollout_len=32",
]
TUNE_KNOBS = [
    "actors=4..16",
    "envs_per_actor=4..64",
    "batch_size=2048..16384",
    "mps_pct=25,50,100",
    *FIXED,
]
GRID_KNOBS = [
    "actors=5,15",
    "envs_per_actor=8,32",
    "batch_size=2048,8192",
    "mps_pct=25,100",
    *FIXED,
]
SHOWN = ("actors", "envs_per_actor", "batch_size", "mps_pct")


UNTIL_WALL_FACTOR = 20.0
"""With ``until``, the run's own wall limit is this many times ``seconds`` (a safety net)."""


def train(
    args: argparse.Namespace,
    seconds: float,
    out: Path,
    extra: list[str],
    until: Callable[[], bool] | None = None,
) -> int:
    """Runs ``autotune train`` for ``seconds`` with ``extra`` flags, its JSON to ``out``. With
    ``until``, the run goes on past ``seconds`` until ``until()`` holds (checked twice a
    second), then Ctrl-C drains it: a slow or loaded machine gets a longer run, not one that
    measured nothing."""
    wall = seconds * UNTIL_WALL_FACTOR if until is not None else seconds
    cmd = [
        sys.executable,
        "-m",
        "autotune.cli",
        "train",
        "--env",
        args.env,
        "--steps",
        "1000000000",
        "--max-wall-s",
        str(wall),
        "--quiet",
        "--json",
        str(out),
        *extra,
    ]
    print(" ".join(cmd), flush=True)
    if until is None:
        return subprocess.run(cmd).returncode
    proc = subprocess.Popen(cmd)
    start = time.monotonic()
    while proc.poll() is None:
        time.sleep(0.5)
        if time.monotonic() - start >= seconds and until():
            proc.send_signal(signal.SIGINT)
            break
    return proc.wait()


def complete_trials(storage: str, study: str) -> int:
    """Measured (COMPLETE) trials of ``study`` so far (0 before it exists)."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
        trials = optuna.load_study(study_name=study, storage=storage).trials
    except KeyError:
        return 0
    return sum(t.state == optuna.trial.TrialState.COMPLETE for t in trials)


def trained_past(progress: Path, skip_s: float, steps: int) -> bool:
    """Whether a run's ``--progress`` file shows ``steps`` trained steps after its first
    ``skip_s`` seconds."""
    from autotune.workflows.progress_log import read_progress

    try:
        rows = read_progress(progress)
    except (OSError, ValueError):
        return False
    if not rows:
        return False
    t0 = rows[0]["t"]
    before = [r["steps"] for r in rows if r["t"] - t0 <= skip_s]
    return rows[-1]["steps"] - (before[-1] if before else 0) >= steps


def knob_args(knobs: list[str]) -> list[str]:
    return [a for k in knobs for a in ("--knob", k)]


def tune_args(args: argparse.Namespace, knobs: list[str], study: str) -> list[str]:
    return [
        "--tune",
        "--in-process",
        "--storage",
        args.storage,
        "--study",
        study,
        "--tune-window-s",
        str(args.window_s),
        "--tune-window-max-s",
        str(max(args.window_max_s, args.window_s)),
        "--tune-warmup-s",
        str(args.warmup_s),
        "--tune-trials",
        str(args.trials),
        *knob_args(args.knob or knobs),
    ]


def fixed_flags(values: dict[str, Any]) -> list[str]:
    """Knob values as plain ``train`` flags (an MPS of 100 % is the default: no flag)."""
    return [
        a
        for k, v in values.items()
        if not (k == "mps_pct" and v == 100)
        for a in (f"--{k.replace('_', '-')}", str(v))
    ]


def report(args: argparse.Namespace, d: Path) -> dict[str, Any]:
    parts = [json.loads(p.read_text()) for p in sorted(d.glob("tune*.json"))]
    default = json.loads((d / "default.json").read_text())
    grid = json.loads((d / "grid.json").read_text())
    # the tuned run on one clock: part k starts where part k-1 ended
    offsets = [sum(p["wall_s"] for p in parts[:k]) for k in range(len(parts))]
    total = sum(p["wall_s"] for p in parts)
    windows, tuned_rows, steps, joules = [], [], 0.0, 0.0
    for offset, part in zip(offsets, parts, strict=True):
        start = part["timeline"]["started_unix"]
        windows += [{**w, "t_run": offset + w["at"] - start} for w in part["tuning"]["windows"]]
        tuned_rows.append([[offset + r[0], *r[1:]] for r in part["timeline"]["rows"]])
        begin = max(0.0, 2 * total / 3 - offset)
        rate = timeline_rate(part, begin, part["wall_s"])
        if rate is None or not rate["steps_per_joule"]:  # a short run: from the row before
            before = [r[0] for r in part["timeline"]["rows"] if r[0] < begin]
            rate = timeline_rate(part, before[-1], part["wall_s"]) if before else rate
        if rate is not None and rate["steps_per_joule"]:
            span = rate["to_s"] - rate["from_s"]
            steps += rate["steps_per_s"] * span
            joules += rate["steps_per_s"] * span / rate["steps_per_joule"]
    tuned_final = steps / joules if joules else None
    default_rate = timeline_rate(default, args.skip_s, default["wall_s"])
    grid_windows = [w for w in grid["tuning"]["windows"] if w["state"] == "trial"]
    if not grid_windows:
        raise SystemExit(f"{d / 'grid.json'} has no measured grid point; run the grid longer")
    grid_best = max(grid_windows, key=lambda w: w["steps_per_joule"] or 0.0)
    doc = {
        "tuned_total_s": total,
        "tuned_final_third_steps_per_joule": tuned_final,
        "tuned_best": parts[-1]["tuning"]["best"],
        "tuned_trials": parts[-1]["tuning"]["trials"],
        "default": default_rate,
        "default_config": {k: default["config"][k] for k in SHOWN},
        "grid_points": len(grid_windows),
        "grid_best": {
            "values": grid_best["values"],
            "steps_per_joule": grid_best["steps_per_joule"],
            "steps_per_s": grid_best["steps_per_s"],
        },
        "grid_median_steps_per_joule": statistics.median(
            w["steps_per_joule"] or 0.0 for w in grid_windows
        ),
        "lost_steps": [p["lost_steps"] for p in (*parts, default, grid)],
    }
    if tuned_final and default_rate and default_rate["steps_per_joule"]:
        doc["vs_default"] = tuned_final / default_rate["steps_per_joule"]
    if tuned_final and grid_best["steps_per_joule"]:
        doc["vs_grid_best"] = tuned_final / grid_best["steps_per_joule"]
    fixed = {}
    for path in sorted(d.glob("fixed-*.json")):
        run = json.loads(path.read_text())
        fixed[path.stem] = {
            "values": {k: run["config"][k] for k in SHOWN},
            **(timeline_rate(run, args.skip_s, run["wall_s"]) or {}),
        }
    if fixed:
        doc["side_by_side"] = fixed
    if args.plot:
        plot(windows, tuned_rows, doc, Path(args.plot))
    return doc


def _rolling(rows: list[list[float]], span_s: float = 30.0) -> list[tuple[float, float]]:
    """Steps/J over the last ``span_s`` of timeline samples, against minutes."""
    out, i = [], 0
    for b in rows:
        while b[0] - rows[i][0] > span_s:
            i += 1
        a = rows[i]
        joules = b[2] - a[2] + b[3] - a[3]
        if b[0] - a[0] >= span_s * 0.8 and joules > 0:
            out.append((b[0] / 60, (b[1] - a[1]) / joules))
    return out


def plot(
    windows: list[dict[str, Any]], parts: list[list[list[float]]], doc: dict[str, Any], path: Path
) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(
        1 + len(SHOWN),
        1,
        figsize=(9, 9),
        sharex=True,
        gridspec_kw={"height_ratios": [3] + [1] * len(SHOWN)},
    )
    ax = axes[0]
    for state, marker in (("trial", "o"), ("hold", "s")):
        pts = [(w["t_run"] / 60, w["steps_per_joule"]) for w in windows if w["state"] == state]
        if pts:
            ax.plot(*zip(*pts, strict=True), marker, ms=4, label=f"tuning window ({state})")
    for k, rows in enumerate(parts):  # counters restart with each part
        roll = _rolling(rows)
        if roll:
            ax.plot(
                *zip(*roll, strict=True),
                "-",
                lw=1,
                color="grey",
                label="run, 30 s rolling" if k == 0 else None,
            )
    if doc.get("default"):
        ax.axhline(doc["default"]["steps_per_joule"], color="red", ls="--", label="default")
    ax.axhline(
        doc["grid_best"]["steps_per_joule"],
        color="green",
        ls=":",
        label="grid best (its one window)",
    )
    again = [r["steps_per_joule"] for k, r in doc.get("side_by_side", {}).items() if "grid" in k]
    if again:
        ax.axhline(
            statistics.mean(again), color="green", ls="-.", label="grid best config, re-measured"
        )
    if doc.get("tuned_final_third_steps_per_joule"):
        t = doc["tuned_total_s"] / 60
        ax.hlines(
            doc["tuned_final_third_steps_per_joule"],
            2 * t / 3,
            t,
            color="blue",
            lw=3,
            label="tuned, final third",
        )
    ax.set_ylabel("trained steps / J")
    ax.legend(fontsize=7, loc="lower right")
    for ax, knob in zip(axes[1:], SHOWN, strict=True):
        pts = [
            (w["t_run"] / 60, w["values"].get(knob, 100 if knob == "mps_pct" else None))
            for w in windows
        ]
        ax.step(*zip(*pts, strict=True), where="pre") if pts else None
        ax.set_ylabel(knob, fontsize=7)
    axes[-1].set_xlabel("minutes of tuning")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
