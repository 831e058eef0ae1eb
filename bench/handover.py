"""GMI hand-overs with and without spare GMI processes, side by side in one invocation.

    python -m bench.handover --env CartPole-v1 --device cpu --handovers 3 \\
        --arms off,on,off,on --json out/handover.json
    python -m bench.handover --env Ant-v5 --device cuda --mps 50,100 --actors 15 \\
        --envs-per-actor 8 --batch-size 4096 --arms off,on --json out/handover.json

Each arm is one run (``runtime.runner.Runner`` in this process, its services as usual) that
replaces its trainer GMIs ``--handovers`` times: each time the current generation has trained
``--every-steps`` steps of its own, the next is asked for (on cuda at the next of the ``--mps``
percentages, in turn). Arm ``off`` sets ``AUTOTUNE_GMI_SPARES=0``; arm ``on`` keeps spares
(``runtime.gmi.spares``), which the first hand-over starts (a run on cuda with MPS set later
keeps them from its start). Per hand-over: ``standby_s`` (the ask to the new GMIs' first report),
the new GMI's own start stages (``gmis[].startup``) and its SM count (an MPS share that applied
shows fewer SMs). Every run's steps must add up. The table, on stdout, sets the hand-overs whose
GMI started afresh beside those whose GMI started from a spare.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path
from typing import Any

from bench.report import machine_doc, write_json
from runtime.gmi.spares import SPARES_ENV

ARMS = {"off": "0", "on": "1"}


def run_arm(arm: str, a: argparse.Namespace) -> dict[str, Any]:
    """One run of ``a``'s workload with spares ``arm`` (off|on); its hand-overs' figures."""
    from runtime.config import TrainConfig
    from runtime.runner import Runner

    cuda = a.device == "cuda"
    pcts = [int(p) for p in a.mps.split(",")] if cuda else [None]
    cfg = TrainConfig(
        env=a.env,
        steps=10**12,
        actors=a.actors,
        envs_per_actor=a.envs_per_actor,
        batch_size=a.batch_size,
        trainer_device=a.device,
        trainers=1,
        mps_pct=(pcts[0],) if cuda else None,
        max_wall_s=a.max_wall_s,
        seed=a.seed,
    )
    before = os.environ.get(SPARES_ENV)
    os.environ[SPARES_ENV] = ARMS[arm]
    try:
        runner = Runner(cfg, cfg.validate(), mps_live=cuda)  # reads the switch
    finally:
        if before is None:
            del os.environ[SPARES_ENV]
        else:
            os.environ[SPARES_ENV] = before
    counted_from: dict[int, int] = {}  # generation -> run's trained steps when it first trained
    asked: set[int] = set()

    def progress(state: Any) -> None:
        gen = runner.generation
        if gen not in counted_from:
            if runner.telemetry.source(f"trainer-0.g{gen}").get("trained_steps", 0) > 0:
                counted_from[gen] = state.trained_steps
            return
        if state.trained_steps - counted_from[gen] < a.every_steps:
            return
        if gen >= a.handovers:
            runner.stop_requested = True  # the last generation trained its share: drain, end
        elif gen + 1 not in asked:
            asked.add(gen + 1)
            pct = pcts[(gen + 1) % len(pcts)]
            runner.request_replace((pct,) if pct is not None else None)

    runner.on_progress = progress
    result = runner.run()
    assert result["sampled_steps"] == (
        result["env_steps"] + result["discarded_steps"] + result["lost_steps"]
    ), "the run's steps do not add up"
    gmis = {g["generation"]: g for g in result["gmis"]}
    return {
        "arm": arm,
        "handovers": [
            {
                "standby_s": h["standby_s"],
                "mps_pct": gmis[h["generation"]]["mps_pct"],
                "sm_count": gmis[h["generation"]]["sm_count"],
                "startup": gmis[h["generation"]]["startup"],
            }
            for h in result["gmi_handovers"]
        ],
        "gmi_spares": result["gmi_spares"],
        "trained_steps": result["env_steps"],
        "lost_steps": result["lost_steps"],
        "wall_s": result["wall_s"],
    }


def summary(runs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The hand-overs of every run, as the new GMIs started: ``afresh`` or ``from a spare``
    (a spare's start stages hold ``spare_s``); for each, every standby, their median and the
    median of each start stage."""
    out: dict[str, dict[str, Any]] = {}
    every = [h for r in runs for h in r["handovers"]]
    for kind in ("afresh", "from a spare"):
        hs = [h for h in every if ("spare_s" in h["startup"]) == (kind == "from a spare")]
        if not hs:
            continue
        stages = [k for k in hs[0]["startup"] if k not in ("spare_s", "total_s")]
        out[kind] = {
            "standby_s": [round(h["standby_s"], 2) for h in hs],
            "median_standby_s": round(statistics.median(h["standby_s"] for h in hs), 2),
            "median_stage_s": {
                k: round(statistics.median(h["startup"].get(k, 0.0) for h in hs), 3) for k in stages
            },
        }
    return out


def table(summ: dict[str, dict[str, Any]]) -> str:
    rows = [
        "| new GMI | hand-overs: standby s | median | median start stages (s) |",
        "|---|---|---:|---|",
    ]
    for kind, s in summ.items():
        stages = ", ".join(f"{k[:-2]} {v}" for k, v in s["median_stage_s"].items())
        standby = ", ".join(map(str, s["standby_s"]))
        rows.append(f"| {kind} | {standby} | {s['median_standby_s']} | {stages} |")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m bench.handover",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--env", default="CartPole-v1")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--mps", default="50,100", help="cuda: MPS %% of each generation, in turn")
    ap.add_argument("--actors", type=int, default=2)
    ap.add_argument("--envs-per-actor", type=int, default=8)
    ap.add_argument("--batch-size", type=int, default=1024)
    ap.add_argument("--handovers", type=int, default=3, help="hand-overs per run (>= 1)")
    ap.add_argument(
        "--every-steps",
        type=int,
        default=60_000,
        help="steps each generation trains before the next is asked for",
    )
    ap.add_argument("--arms", default="off,on", help="comma-separated, each off or on")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-wall-s", type=float, default=600.0, help="safety limit per run")
    ap.add_argument("--json", type=Path, default=None, help="write the runs and summary here")
    a = ap.parse_args(argv)
    arms = [x.strip() for x in a.arms.split(",") if x.strip()]
    bad = [x for x in arms if x not in ARMS]
    if bad or not arms:
        ap.error(f"--arms {a.arms!r}: each must be one of {', '.join(ARMS)}")
    if a.handovers < 1 or a.every_steps < 1:
        ap.error("--handovers and --every-steps must be at least 1")
    runs = []
    for arm in arms:
        runs.append(run_arm(arm, a))
        print(
            f"[handover] spares {arm}: standby "
            f"{[round(h['standby_s'], 2) for h in runs[-1]['handovers']]} s",
            file=sys.stderr,
        )
    summ = summary(runs)
    print(table(summ))
    if a.json is not None:
        write_json(
            a.json,
            {
                "machine": machine_doc(),
                "command": [
                    "python",
                    "-m",
                    "bench.handover",
                    *(sys.argv[1:] if argv is None else argv),
                ],
                "runs": runs,
                "summary": summ,
            },
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
