"""One arm of ``python -m bench peers``: its process run to its budget and its figures taken.

Each arm writes a progress curve (``autotune/workflows/progress_log.py``). Its figures are taken
over a window of that curve: from ``--warmup-s`` after its first trained step to its last line
(the ``tuned`` arm: the final third of its trained span, after the tuner has had its time). The
window's trained steps divided by its seconds and by the machine's joules in it (``MachineMeter``
samples) give steps/s, GPU W, CPU W and steps/J, charged the same way for every arm.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

from autotune.workflows.progress_log import read_progress
from bench.compare_arms import arm_command
from bench.machine_meter import MachineMeter
from bench.report import write_json

START_ALLOWANCE_S = 180.0
"""How long past its budget an arm may run (start-up, drain) before it is stopped."""


def window(rows: list[dict[str, Any]], warmup_s: float, final_third: bool) -> tuple[dict, dict]:
    """The first and last progress lines of the measured span (see the module docstring)."""
    started = [r for r in rows if r["steps"] > 0]
    if len(started) < 2:
        raise ValueError("fewer than two progress lines after the first trained step")
    t0 = started[0]["t"] + warmup_s
    if final_third:
        t0 = max(t0, started[-1]["t"] - (started[-1]["t"] - started[0]["t"]) / 3)
    inside = [r for r in started if r["t"] >= t0]
    if len(inside) < 2 or inside[-1]["t"] <= inside[0]["t"]:
        raise ValueError(
            f"fewer than two progress lines {warmup_s} s after the first trained "
            "step: run the arm longer (--seconds) or warm up less (--warmup-s)"
        )
    return inside[0], inside[-1]


def measure(
    rows: list[dict[str, Any]], meter: MachineMeter, warmup_s: float, final_third: bool = False
) -> dict[str, Any]:
    """Trained steps/s, GPU W, CPU W and steps/J of one arm's window."""
    a, b = window(rows, warmup_s, final_third)
    (ga, ca), (gb, cb) = meter.at(a["t"]), meter.at(b["t"])
    span, steps = b["t"] - a["t"], b["steps"] - a["steps"]
    joules = (gb - ga) + (cb - ca)
    return {
        "window_s": span,
        "window_steps": steps,
        "steps_per_s": steps / span,
        "gpu_w": (gb - ga) / span,
        "cpu_w": (cb - ca) / span,
        "steps_per_joule": steps / joules if joules > 0 else None,
        "final_return": rows[-1].get("return"),
        "final_steps": rows[-1]["steps"],
    }


def run_arm(arm: str, a: argparse.Namespace, meter: MachineMeter, out_dir: Path) -> dict:
    stem = f"{a.env}-{arm}"
    progress, result = out_dir / f"{stem}.progress.jsonl", out_dir / f"{stem}.result.json"
    cmd = arm_command(arm, a, progress, result)
    budget = (a.tuned_s if arm == "tuned" else a.seconds) + START_ALLOWANCE_S
    print(f"[{arm}] {' '.join(cmd)}", flush=True)
    doc: dict[str, Any] = {
        "arm": arm,
        "env": a.env,
        "policy": a.policy,
        "command": cmd,
        "started_unix": time.time(),
        **meter.sources,
    }
    log = (out_dir / f"{stem}.log").open("w")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        doc["returncode"] = proc.wait(timeout=budget)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGINT)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        doc["returncode"] = proc.returncode
        doc["note"] = f"stopped after {budget:.0f} s"
    log.close()
    meter.sample()  # so the arm's last progress line lies inside the sampled span
    doc["wall_s"] = time.time() - doc["started_unix"]
    try:
        rows = read_progress(progress)
        doc.update(measure(rows, meter, a.warmup_s, final_third=arm == "tuned"))
    except (OSError, ValueError) as exc:
        doc["error"] = f"{exc} (log: {stem}.log)"
    if result.exists():
        res = json.loads(result.read_text())
        doc["lost_steps"] = res.get("lost_steps")
        doc["config"] = {
            k: res["config"][k]
            for k in (
                "actors",
                "envs_per_actor",
                "batch_size",
                "trainers",
                "mps_pct",
                "trainer_device",
            )
        }
    write_json(out_dir / f"{stem}.json", doc)
    shown = {
        k: round(v, 2) if isinstance(v, float) else v
        for k, v in doc.items()
        if k in ("steps_per_s", "gpu_w", "cpu_w", "steps_per_joule", "returncode", "error")
    }
    print(f"[{arm}] {shown}", flush=True)
    return doc
