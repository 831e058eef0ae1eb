"""Runs ``autotune train`` arguments and prints the trainers' and migrator's counters each second.

    python -m bench.trace_run -- --env Ant-v5 --actors 15 --trainers 2 --max-wall-s 25

For a run that is slower than expected or seems stuck: one line per second with trained and
sampled steps, each GMI's queued steps and version, and the migrator's pending messages and
per-trainer credits. ``--dump-at S`` also sends SIGUSR1 to every service (compressor, migrator,
trainer GMIs) at S seconds, which
prints their Python stacks to stderr.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys

from autotune.cli import build_parser
from autotune.cli_train import config_from_args
from runtime.runner import Runner, RunState


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dump-at", type=float, default=None)
    ap.add_argument("train_args", nargs=argparse.REMAINDER)
    a = ap.parse_args()
    args = build_parser().parse_args(["train", *[x for x in a.train_args if x != "--"]])
    cfg = config_from_args(args)
    runner = Runner(cfg, cfg.validate(), mps_changes=args.mps_change)
    marks = {"next": 1.0, "dumped": False}

    def show(state: RunState) -> None:
        if a.dump_at is not None and not marks["dumped"] and state.elapsed_s >= a.dump_at:
            marks["dumped"] = True
            for proc in runner.services.values():
                if proc.pid:
                    os.kill(proc.pid, signal.SIGUSR1)
        if state.elapsed_s < marks["next"]:
            return
        marks["next"] += 1.0
        tel = runner.telemetry
        gmis = {n: (tel.source(n).get("queued_steps"), tel.source(n).get("version"))
                for n in tel.trainer_sources()}  # fmt: skip
        mig = tel.source("migrator")
        credits = {k: v.get("credits") for k, v in (mig.get("trainers") or {}).items()}
        print(f"{state.elapsed_s:5.1f}s trained {state.trained_steps:>9,} sampled "
              f"{state.sampled_steps:>9,} gmis {gmis} pending {mig.get('pending')} "
              f"credits {credits}", file=sys.stderr, flush=True)  # fmt: skip

    runner.on_progress = show
    result = runner.run()
    print({k: result[k] for k in ("env_steps", "sampled_steps", "lost_steps", "steps_per_s",
                                  "gmi_sharing", "weights_identical")})  # fmt: skip


if __name__ == "__main__":
    main()
