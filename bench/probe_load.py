"""``python -m bench.probe_load``: how far a busy machine moves the workload probes that ``auto``
sizing builds on, and that the probe cache keeps for a week.

Three conditions, one after the other: quiet, with ``--busy`` processes spinning (pure-Python
loops, several per core: another job's actors, say), and quiet again. In each:

* the probes as a run takes them (``runtime.probes.run_probes``, in their child process): one
  env step, the policy forward at 32 envs, and the CPU learner's update at ``--batch`` samples
  from the line its probe fitted;
* the same CPU update timed here on both clocks side by side (one epoch's, counted for the
  learner's epochs as the probe counts it): as time passes, and on the timing thread's CPU
  clock (what the probes use for work on their own thread).

Each figure under load is divided by the mean of the two quiet ones. Prints a table;
``--json PATH`` writes the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from typing import Any

POLICY = "auto:64:64:auto"


def probe_figures(env: str, policy: str, rollout: int, batch: int) -> dict[str, float]:
    from runtime.probes import run_probes

    p = run_probes(env, policy, rollout, {}, ["cpu"])
    fixed, per = p.learners["cpu"].fit()
    return {
        "env_step_us": p.env_step_s * 1e6,
        "forward32_us": p.forward_s[32] * 1e6,
        "update_ms": (fixed + per * batch) * 1e3,
    }


def direct_update(env: str, policy: str, rollout: int, batch: int) -> dict[str, float]:
    """A learner's update at ``batch`` samples timed on both clocks, one clock after the
    other: one epoch's, counted ``epochs`` times, as the probe counts it."""
    import torch

    from policies.appo_config import APPOConfig
    from runtime.env_probes import timed
    from runtime.envs import probe_env
    from runtime.learner_probe import make_learner, synthetic_batch

    torch.set_num_threads(1)
    info = probe_env(env)
    _, update = make_learner(info, policy, "cpu", {"epochs": 1})
    data = synthetic_batch(info, batch, rollout)
    ms = APPOConfig().epochs * 1e3
    return {
        "wall_ms": timed(lambda: update(data), budget_s=1.0, clock=time.perf_counter) * ms,
        "thread_ms": timed(lambda: update(data), budget_s=1.0, clock=time.thread_time) * ms,
    }


def measure(env: str, policy: str, rollout: int, batch: int, busy: int) -> dict[str, Any]:
    def condition(name: str) -> dict[str, Any]:
        return {
            "name": name,
            "probes": probe_figures(env, policy, rollout, batch),
            "direct": direct_update(env, policy, rollout, batch),
        }

    rows = [condition("quiet")]
    spin: list[subprocess.Popen] = []
    try:
        for _ in range(busy):
            spin.append(subprocess.Popen([sys.executable, "-c", "while True: pass"]))
        time.sleep(1.0)  # every spinner running
        rows.append(condition(f"{busy} busy processes"))
    finally:
        for proc in spin:
            proc.kill()
            proc.wait()
    rows.append(condition("quiet again"))
    ratios = {}
    for part in ("probes", "direct"):
        for key in rows[0][part]:
            quiet = (rows[0][part][key] + rows[2][part][key]) / 2
            ratios[f"{part}.{key}"] = rows[1][part][key] / quiet
    doc = {"env": env, "policy": policy, "batch": batch, "busy": busy, "cores": os.cpu_count()}
    return {**doc, "rows": rows, "loaded_over_quiet": ratios}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m bench.probe_load", description=__doc__.split("\n\n")[0]
    )
    ap.add_argument("--env", default="CartPole-v1")
    ap.add_argument("--policy", default=POLICY)
    ap.add_argument("--rollout-len", type=int, default=32)
    ap.add_argument("--batch", type=int, default=4096, help="the update's samples (default 4096)")
    ap.add_argument(
        "--busy", type=int, default=3 * (os.cpu_count() or 1), help="spinning processes"
    )
    ap.add_argument("--json", default=None, metavar="PATH")
    args = ap.parse_args(argv)
    if args.busy < 1 or args.batch < args.rollout_len or args.rollout_len < 1:
        ap.error("--busy must be at least 1, --rollout-len at least 1 and --batch at least it")
    doc = measure(args.env, args.policy, args.rollout_len, args.batch, args.busy)
    for row in doc["rows"]:
        figures = {**row["probes"], **{f"direct_{k}": v for k, v in row["direct"].items()}}
        print(f"{row['name']:>20}: " + ", ".join(f"{k} {v:.1f}" for k, v in figures.items()))
    print(
        "loaded / quiet: " + ", ".join(f"{k} {v:.2f}" for k, v in doc["loaded_over_quiet"].items())
    )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(doc, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
