"""One ``autotune train`` run as a benchmark arm: its own process, a wall budget, and the
figures the suites compare (the whole run, and a window of its progress curve)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

SIZED = (
    ("actors", "--actors"),
    ("envs_per_actor", "--envs-per-actor"),
    ("batch_size", "--batch-size"),
    ("trainer_device", "--trainer-device"),
    ("trainers", "--trainers"),
)


def add_train_steps_arg(ap) -> None:
    """A suite's ``--train-steps``: also end a train arm at that many trained steps."""
    ap.add_argument(
        "--train-steps",
        type=int,
        default=None,
        help="also end an arm at this many trained steps (a short check that waits on "
        "progress, not on a wall budget a loaded machine may spend starting up)",
    )


def check_train_steps(ap, a) -> None:
    if a.train_steps is not None and a.train_steps < 1:
        ap.error(f"--train-steps {a.train_steps}: must be >= 1 (or left out)")


def train_run(
    stem: Path, flags: list[str], wall_s: float, warmup_s: float, steps: int | None = None
) -> dict:
    """Runs ``autotune train FLAGS`` for ``wall_s`` seconds of wall time (start-up included),
    or to ``steps`` trained steps where given and reached first, writing ``STEM.json`` and
    ``STEM.progress.jsonl``.

    Returns the arm's figures: its whole run (trained steps over the process's wall time), its
    window (from ``warmup_s`` after its first trained step to its last progress line), the
    config it ran (``sizing.chosen`` where it sized itself, else its config's sized fields),
    and its accounting; or ``{"failed": True, ...}`` with why.
    """
    from autotune.workflows.progress_log import read_progress
    from bench.compare import window

    stem.parent.mkdir(parents=True, exist_ok=True)
    cmd = [
        sys.executable,
        "-m",
        "autotune.cli",
        "train",
        *flags,
        "--steps",
        str(steps or 1_000_000_000),
        "--max-wall-s",
        str(wall_s),
        "--quiet",
        "--progress",
        f"{stem}.progress.jsonl",
        "--json",
        f"{stem}.json",
    ]
    t0 = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=wall_s + 300)
    wall = time.monotonic() - t0
    if proc.returncode != 0:
        return {"failed": True, "stderr": proc.stderr[-2000:]}
    doc = json.loads(Path(f"{stem}.json").read_text())
    try:
        first, last = window(read_progress(f"{stem}.progress.jsonl"), warmup_s, False)
    except ValueError as exc:  # too short a run for a window: the whole run stands alone
        return {"failed": True, "why": str(exc), "trained_steps": doc["env_steps"]}
    span = last["t"] - first["t"]
    cfg = doc["config"]
    chosen = (doc.get("sizing") or {}).get("chosen") or {}
    return {
        "config": {
            **{k: cfg.get(k) for k, _ in SIZED},
            **chosen,
            "trainer_device": doc.get("trainer_device"),
        },
        "mps_pct": cfg.get("mps_pct"),
        "env_backend": cfg.get("env_backend"),
        "transport": cfg.get("transport"),
        "trained_steps": doc["env_steps"],
        "sampled_steps": doc["sampled_steps"],
        "lost_steps": doc["lost_steps"],
        "auth_refused": doc.get("auth_refused", 0),
        "process_s": wall,
        "whole_steps_per_s": doc["env_steps"] / wall,
        "window_steps_per_s": (last["steps"] - first["steps"]) / span,
        "window_s": span,
        "steps_per_joule": doc.get("steps_per_joule"),
        "return_mean": doc.get("return_mean"),
        "energy_nodes": doc.get("energy", {}).get("nodes"),  # a --cluster run's
    }


def sized_flags(arm: dict) -> list[str]:
    """The flags that run ``arm``'s config again as given (no sizing): actors, envs per
    actor, batch size, trainer device, trainers and the MPS share."""
    c = arm["config"]
    out = []
    for key, flag in SIZED:
        if c.get(key) is not None:
            out += [flag, str(c[key])]
    if arm.get("mps_pct"):
        out += ["--mps-pct", ",".join(str(p) for p in arm["mps_pct"])]
    return out
