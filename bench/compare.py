"""Side by side on one machine: the physical limit, the peers and this project, one env per run.

    python -m bench.compare run --env Ant-v5 --policy auto:256:128:64:auto --seconds 60 \\
        --exported bench/exports/ant-export.json --out out/compare
    python -m bench.compare report --dir out/compare --markdown out/compare/table.md \\
        --plots out/compare/plots

``run`` starts each arm as its own process, one after the other, while ``MachineMeter`` samples
the whole machine's energy (every GPU through NVML; the CPU through RAPL or the labelled model).
Each arm writes a progress curve (``autotune/workflows/progress_log.py``). Its figures are taken over a
window of that curve: from ``--warmup-s`` after its first trained step to its last line (the
``tuned`` arm: the final third of its trained span, after the tuner has had its time). The
window's trained steps divided by its seconds and by the machine's joules in it give steps/s,
GPU W, CPU W and steps/J, charged the same way for every arm.

Arms (``--arms``, comma-separated):
  limit     random-action stepping on every core, no learning, no torch, GPU idle (no context)
  sb3-cpu   Stable-Baselines3 PPO, SubprocVecEnv (one env per core), trainer on the CPU
  sb3-cuda  the same with the trainer on cuda
  cleanrl   CleanRL-style PPO on AsyncVectorEnv (one env per core), cuda where there is one
  default   ``autotune train`` with its default config (only --policy set)
  exported  ``autotune train --config FILE`` (``--exported FILE``; --policy set); more exported
            configs side by side: ``--exported LABEL=FILE`` (repeatable), each run as the arm
            ``exported-LABEL`` wherever ``exported`` is listed
  tuned     ``autotune train --tune`` for ``--tuned-s``, measured over its final third

``--limit-again`` runs the limit once more after every other arm (``limit-end``): the report's
ratios are then to the mean of the two limits, and it prints their drift, since a shared
machine's raw stepping rate can move by 25 % between two runs minutes apart.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from autotune.workflows.progress_log import read_progress
from bench.compare_arms import (
    ARMS,
    LIMIT_END,
    TRAIN_STARTUP_S,
    arm_command,
    exported_arms,
)
from bench.machine_meter import MachineMeter

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
    (out_dir / f"{stem}.json").write_text(json.dumps(doc, indent=2) + "\n")
    shown = {
        k: round(v, 2) if isinstance(v, float) else v
        for k, v in doc.items()
        if k in ("steps_per_s", "gpu_w", "cpu_w", "steps_per_joule", "returncode", "error")
    }
    print(f"[{arm}] {shown}", flush=True)
    return doc


def machine_doc() -> dict[str, Any]:
    doc: dict[str, Any] = {
        "host": platform.node(),
        "cores": os.cpu_count(),
        "python": platform.python_version(),
        "date_utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime()),
    }
    try:
        from runtime.hw.gpus import list_gpus

        doc["gpus"] = [g.name for g in list_gpus()]
    except Exception as exc:  # an inventory failure must not stop a benchmark
        doc["gpus"] = f"unknown ({exc})"
    return doc


def cmd_run(a: argparse.Namespace) -> int:
    arms = [x.strip() for x in a.arms.split(",") if x.strip()]
    bad = [x for x in arms if x not in ARMS]
    if bad or not arms:
        raise SystemExit(f"--arms: unknown {bad or 'nothing given'}; allowed {', '.join(ARMS)}")
    a.exports = exported_arms(a.exported)
    if "exported" in arms:
        if not a.exports:
            raise SystemExit("the exported arm needs --exported FILE (an `autotune export` file)")
        at = arms.index("exported")
        arms[at : at + 1] = list(a.exports)
    if a.limit_again:
        if "limit" not in arms:
            raise SystemExit("--limit-again measures the limit arm again: add limit to --arms")
        arms.append(LIMIT_END)
    out_dir = Path(a.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "machine.json").write_text(json.dumps(machine_doc(), indent=2) + "\n")
    meter = MachineMeter().start()
    failed = 0
    try:
        for arm in arms:
            doc = run_arm(arm, a, meter, out_dir)
            failed += "error" in doc or doc["returncode"] != 0
            time.sleep(a.settle_s)
    finally:
        meter.stop()
    return 1 if failed else 0


def cmd_report(a: argparse.Namespace) -> int:
    from bench.compare_report import report

    doc = report(Path(a.dir), a.markdown, a.plots)
    print(json.dumps(doc["goals"], indent=2))
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=__doc__.split("\n", 1)[1],
    )
    sub = ap.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run the arms for one env")
    run.add_argument("--env", default="Pendulum-v1")
    run.add_argument("--arms", default=",".join(ARMS))
    run.add_argument(
        "--policy",
        default="auto:256:128:64:auto",
        help="MLP of every learning arm (peers get its hidden sizes)",
    )
    run.add_argument("--seconds", type=float, default=60.0, help="wall budget of each arm")
    run.add_argument("--tuned-s", type=float, default=240.0, help="wall budget of the tuned arm")
    run.add_argument(
        "--warmup-s", type=float, default=10.0, help="left out after an arm's first trained step"
    )
    run.add_argument("--settle-s", type=float, default=5.0, help="pause between arms")
    run.add_argument(
        "--peer-rollout",
        type=int,
        default=2048,
        help="steps per rollout of the peers, all envs (default 2048, the RL Zoo's); a peer's "
        "trained steps show once per rollout, so a short --seconds needs short rollouts",
    )
    run.add_argument(
        "--startup-s",
        type=float,
        default=TRAIN_STARTUP_S,
        help="added to the default and exported arms' wall budget for their start-up",
    )
    run.add_argument(
        "--exported",
        action="append",
        default=None,
        metavar="[LABEL=]FILE",
        help="an exported config for the exported arm; repeat with LABEL=FILE for more arms",
    )
    run.add_argument(
        "--knob",
        action="append",
        default=None,
        help="the tuned arm's knobs (replaces its list; as in `autotune train --knob`)",
    )
    run.add_argument(
        "--limit-again",
        action="store_true",
        help="measure the limit again after every other arm (as limit-end); the report then "
        "takes the two limits' mean and prints their ratio, so a machine whose speed drifted "
        "during the run shows it",
    )
    run.add_argument("--out", required=True, help="directory for every arm's files")
    run.set_defaults(func=cmd_run)
    rep = sub.add_parser("report", help="tables, ratios, goals and plots from run directories")
    rep.add_argument("--dir", required=True, help="a run's --out (or a parent of several)")
    rep.add_argument("--markdown", default=None, metavar="FILE")
    rep.add_argument("--plots", default=None, metavar="DIR")
    rep.set_defaults(func=cmd_report)
    a = ap.parse_args(argv)
    if a.command == "run" and (
        a.seconds <= 0
        or a.tuned_s <= 0
        or a.peer_rollout < 1
        or min(a.warmup_s, a.settle_s, a.startup_s) < 0
    ):
        ap.error(
            "--seconds and --tuned-s must be > 0, --peer-rollout >= 1; --warmup-s, --settle-s,"
            " --startup-s >= 0"
        )
    return a.func(a)


if __name__ == "__main__":
    sys.exit(main())
