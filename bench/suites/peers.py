"""Side by side on one machine: the physical limit, the peers (Stable-Baselines3, CleanRL) and
this project's arms, one env per run, then the report (tables, ratios, goals, plots).

    python -m bench peers --env Ant-v5 --policy auto:256:128:64:auto --seconds 60 \\
        --exported bench/exports/ant-export.json --markdown out/peers/table.md \\
        --plots out/peers/plots --state st --part-s 590 --out out/peers

Each arm is a step (``bench/compare.py``): its own process, one after the other, while the whole
machine's energy is sampled (every GPU through NVML; the CPU through RAPL or the labelled model),
figures taken over a window of its progress curve: from ``--warmup-s`` after its first trained
step to its last line (``tuned``: the final third of its trained span). Then the ``report`` step
reads every arm document under ``--out`` (``bench/compare_report.py``; ``--only report`` remakes
it alone). Arm files go to ``OUT/<env>/`` (``OUT/<workload>[/round<k>]/`` with ``--workloads``).

Arms (``--arms``, comma-separated):
  limit     random-action stepping on every core, no learning, no torch, GPU idle (no context)
  sb3-cpu   Stable-Baselines3 PPO, SubprocVecEnv (one env per core), trainer on the CPU
  sb3-cuda  the same with the trainer on cuda
  cleanrl   CleanRL-style PPO on AsyncVectorEnv (one env per core), cuda where there is one
  default   ``autotune train`` with its default config (only --policy set)
  exported  ``autotune train --config FILE`` (``--exported FILE``; --policy set); more exported
            configs side by side: ``--exported LABEL=FILE`` (repeatable), each run as the arm
            ``exported-LABEL`` wherever ``exported`` is listed
  states    after default: the actor's own collect loop on every core, acting with the policy
            the default arm ended with (its checkpoint), at its env backend and envs per actor,
            then random actions the same way (``bench/actor_loop_rate.py``), ``--states-s``
            each: what the env's steps cost in the states a learning run reaches (a MuJoCo
            step costs more with the body upright than in random actions' falls), so the
            report can set the arm beside the most its states allow
  learner   the learner alone on synthetic batches (``bench/learner_limit.py``): joules per
            trained sample above idle, per device and batch size; with the limit, the second
            limit (one that counts the learning)
  tuned     ``autotune train --tune`` (the model sampler) for ``--tuned-s``, measured over its
            final third and whole (start-up included)
  tuned-tpe the same with ``--tune-sampler tpe``
  tuned-best ``autotune train`` with the tuned arm's best config as flags, for ``--seconds``:
            the best static config known where no study's export exists (list it after tuned)

``--limit-again`` runs the limit once more after every other arm (``limit-end``): the report's
ratios are then to the mean of the two limits, and it prints their drift, since a shared
machine's raw stepping rate can move by 25 % between two runs minutes apart. ``--workloads``
runs the arms for each named workload (env and policy) instead of ``--env``/``--policy``,
``--rounds`` times each (each round between its own two limits with ``--limit-again``);
``--own-exports DIR`` adds ``DIR/<workload>-export.json``, where there is one, as ``exported-own``.
"""

from __future__ import annotations

import argparse
import copy
import json
import time
from pathlib import Path

from bench.compare_arms import (
    ARMS,
    LIMIT_END,
    SIZING_S,
    TRAIN_STARTUP_S,
    arm_kind,
    exported_arms,
)
from bench.suite import Step

NAME = "peers"
HELP = "side by side: the limit, SB3, CleanRL and this project's arms, with the report"
WORKLOADS = {
    "ant": ("Ant-v5", "auto:256:128:64:auto"),
    "halfcheetah": ("HalfCheetah-v5", "auto:256:128:64:auto"),
    "humanoid": ("Humanoid-v5", "auto:400:200:100:auto"),
    "ant-heavy": ("Ant-v5", "auto:1024:1024:512:auto"),
}
PARTS = ("arms", "report")
STATES_START_S = 20.0
"""About how long a loop of the states arm takes to start its processes and make their envs."""
LEARNER_S = 75.0
"""About how long the learner arm takes (idle, then 3 batch sizes on each device)."""


def add_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--only", default="arms,report", help="arms, report or both")
    ap.add_argument("--env", default="Pendulum-v1")
    ap.add_argument("--arms", default=",".join(ARMS))
    ap.add_argument(
        "--policy",
        default="auto:256:128:64:auto",
        help="MLP of every learning arm (peers get its hidden sizes)",
    )
    ap.add_argument(
        "--workloads",
        default=None,
        help=f"instead of --env/--policy, comma-separated of {', '.join(WORKLOADS)}",
    )
    ap.add_argument("--rounds", type=int, default=1, help="the arms this many times per workload")
    ap.add_argument("--own-exports", default=None, metavar="DIR", help="<workload>-export.json")
    ap.add_argument("--seconds", type=float, default=60.0, help="wall budget of each arm")
    ap.add_argument(
        "--states-s", type=float, default=15.0, help="seconds of each loop of the states arm"
    )
    ap.add_argument("--tuned-s", type=float, default=240.0, help="wall budget of the tuned arm")
    ap.add_argument(
        "--warmup-s", type=float, default=10.0, help="left out after an arm's first trained step"
    )
    ap.add_argument("--settle-s", type=float, default=5.0, help="pause between arms")
    ap.add_argument(
        "--peer-rollout",
        type=int,
        default=2048,
        help="steps per rollout of the peers, all envs (default 2048, the RL Zoo's); a peer's "
        "trained steps show once per rollout, so a short --seconds needs short rollouts",
    )
    ap.add_argument(
        "--startup-s",
        type=float,
        default=TRAIN_STARTUP_S,
        help="added to the default and exported arms' wall budget for their start-up "
        f"(the default arm gets {SIZING_S:.0f} s more for its probes)",
    )
    ap.add_argument(
        "--min-steps",
        type=int,
        default=0,
        help="the default, exported and peer arms run on past their wall budget until they "
        "trained this many steps (then Ctrl-C drains ours; a peer stops itself): a loaded "
        "machine gets longer runs, not empty ones",
    )
    ap.add_argument(
        "--exported",
        action="append",
        default=None,
        metavar="[LABEL=]FILE",
        help="an exported config for the exported arm; repeat with LABEL=FILE for more arms",
    )
    ap.add_argument(
        "--knob",
        action="append",
        default=None,
        help="the tuned arm's knobs (replaces its list; as in `autotune train --knob`)",
    )
    ap.add_argument(
        "--tune-space",
        choices=("narrow", "full"),
        default="narrow",
        help="the tuned arms' knob space without --knob: narrow (a GPU trainer, 4..16 actors, "
        "batches of 2k..16k) or full (every knob, as `autotune train --tune` alone)",
    )
    ap.add_argument(
        "--limit-again",
        action="store_true",
        help="measure the limit again after every other arm (as limit-end); the report then "
        "takes the two limits' mean and prints their ratio, so a machine whose speed drifted "
        "during the run shows it",
    )
    ap.add_argument("--markdown", default=None, metavar="FILE", help="report: the tables")
    ap.add_argument("--plots", default=None, metavar="DIR", help="report: the bar plots")


def check(ap: argparse.ArgumentParser, a: argparse.Namespace) -> None:
    if (
        a.seconds <= 0
        or a.tuned_s <= 0
        or a.states_s <= 0
        or a.peer_rollout < 1
        or min(a.warmup_s, a.settle_s, a.startup_s, a.min_steps) < 0
    ):
        ap.error(
            "--seconds, --tuned-s and --states-s must be > 0, --peer-rollout >= 1; --warmup-s,"
            " --settle-s, --startup-s >= 0"
        )
    a.only = [x.strip() for x in a.only.split(",") if x.strip()]
    bad = [x for x in a.only if x not in PARTS]
    if bad or not a.only:
        ap.error(f"--only: unknown {bad or 'nothing given'}; allowed {', '.join(PARTS)}")
    if a.rounds < 1:
        ap.error(f"--rounds {a.rounds}: a whole number >= 1")
    names = [x.strip() for x in (a.workloads or "").split(",") if x.strip()]
    if unknown := [w for w in names if w not in WORKLOADS]:
        ap.error(f"--workloads: unknown {unknown}; allowed {', '.join(WORKLOADS)}")
    a.workload_names = names
    if "arms" not in a.only:
        return
    arms = [x.strip() for x in a.arms.split(",") if x.strip()]
    bad = [x for x in arms if x not in ARMS]
    if bad or not arms:
        raise SystemExit(f"--arms: unknown {bad or 'nothing given'}; allowed {', '.join(ARMS)}")
    a.exports = exported_arms(a.exported)
    if "exported" in arms and not a.exports:
        raise SystemExit("the exported arm needs --exported FILE (an `autotune export` file)")
    best = arms.index("tuned-best") if "tuned-best" in arms else None
    if best is not None and ("tuned" not in arms or arms.index("tuned") > best):
        raise SystemExit("--arms: tuned-best runs the tuned arm's best config; list tuned first")
    if "states" in arms and ("default" not in arms or arms.index("default") > arms.index("states")):
        raise SystemExit("--arms: states steps the default arm's final policy; list default first")
    if a.limit_again and "limit" not in arms:
        raise SystemExit("--limit-again measures the limit arm again: add limit to --arms")
    a.arm_list = arms


def _arm_names(arms: list[str], exports: dict) -> list[str]:
    out = list(arms)
    if "exported" in out:
        at = out.index("exported")
        out[at : at + 1] = list(exports)
    return out


def _runs(a: argparse.Namespace) -> list[tuple[str, argparse.Namespace]]:
    """``(run dir under --out, the arms' namespace)`` for each run of the arms."""
    if not a.workload_names:
        return [(a.env, a)]
    out = []
    for w in a.workload_names:
        env, policy = WORKLOADS[w]
        exports = dict(a.exports)
        own = Path(a.own_exports or "") / f"{w}-export.json"
        if a.own_exports and own.is_file():
            exports["exported-own"] = own
        for k in range(1, a.rounds + 1):
            run = copy.copy(a)
            run.env, run.policy, run.exports = env, policy, exports
            out.append((f"{w}/round{k}" if a.rounds > 1 else w, run))
    return out


def arm_step(name: str, arm: str, run: argparse.Namespace, out_dir: Path, first: bool) -> dict:
    from bench.compare import run_arm
    from bench.machine_meter import MachineMeter
    from bench.report import machine_doc, write_json

    out_dir.mkdir(parents=True, exist_ok=True)
    if first:
        write_json(out_dir / "machine.json", machine_doc())
    run = copy.copy(run)
    run.out = str(out_dir)
    meter = MachineMeter().start()
    try:
        doc = run_arm(arm, run, meter, out_dir)
    finally:
        meter.stop()
    time.sleep(run.settle_s)
    doc["failed"] = "error" in doc or doc["returncode"] != 0
    return doc


def plan(a: argparse.Namespace):
    steps = []
    if "arms" in a.only:
        for sub, run in _runs(a):
            names = _arm_names(a.arm_list, run.exports)
            if a.limit_again:
                names.append(LIMIT_END)
            for k, arm in enumerate(names):
                budget = run.tuned_s if arm_kind(arm) == "tuned" else run.seconds
                if arm == "learner":
                    budget = LEARNER_S
                if arm == "states":  # two loops, each with its processes' start
                    budget = 2 * (run.states_s + STATES_START_S)
                if arm_kind(arm) in ("default", "exported"):
                    budget += run.startup_s
                if arm_kind(arm) == "default":
                    budget += SIZING_S
                steps.append(
                    Step(
                        f"{sub}/{arm}",
                        lambda arm=arm, run=run, sub=sub, k=k: arm_step(
                            f"{sub}/{arm}", arm, run, Path(a.out) / sub, k == 0
                        ),
                        budget + 30 + a.settle_s,
                    )
                )
    if "report" in a.only:
        steps.append(Step("report", lambda: report(a), 30))
    return steps, None


def report(a: argparse.Namespace) -> dict:
    from bench.compare_report import report as make

    doc = make(Path(a.out), a.markdown, a.plots)
    print(json.dumps(doc["goals"], indent=2))
    return doc["goals"]
