"""Energy to a target return, tuned online by steps per joule and by goodput per joule, several
seeds one run after another on one machine; then the table and the plot of return to joules.

    python -m bench goodput --env Ant-v5 --seeds 0,1,2 --target-return 1000 --max-wall-s 240 \\
        --reference-return 390 --state st --part-s 540 --out out/goodput \\
        --markdown out/goodput/table.md --plot out/goodput/return-vs-joules.png

Steps ``<arm>-seed<S>`` (seeds outer, the two tunings inner, so that the host's drift meets
both alike): ``autotune train --tune --objective steps_per_joule|goodput_per_joule
--target-return R --max-wall-s W --seed S`` with ``--train-args`` (by default `auto` sizing on
EnvPool where it has the env, the policy ``auto:256:128:64:auto`` and PPO's MuJoCo learner
settings, minibatches of 512 samples at least). Each run has its own Optuna study in SQLite
under ``--out``, its progress curve, its log and its result document, and probes its workload
afresh (a probe cache of its own), so that every run pays a first run's start-up alike; with
``--probe-cache shared`` the runs share one cache, so that only the first run of a workload
probes and compiles, and the later ones start as a user's next run would. A run
stops at the first 100-episode mean of at least R, or at W seconds (then it did not get there;
its best return is kept, and what it spent).

With ``--sb3-window S`` a first step ``sb3`` runs SB3 PPO on the same host (``bench peers``'
sb3-cpu arm, metered for S seconds after ``--sb3-warmup-s``), so that SB3's joules for the
``--sb3-steps`` it takes to ``--reference-return`` are measured beside the runs.

Step ``report``: per run the joules, seconds and trained steps to the target, its whole-run
steps/J, where it first reached ``--reference-return`` (SB3 PPO's 1M-step return on the page);
per seed, the steps/J run's joules over the goodput run's (or a bound); with the ``sb3`` step,
SB3's joules over each run's to the reference return; the plot.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

from bench.goodput_report import ARMS, against_sb3, probes_note, summary, table
from bench.suite import Step

NAME = "goodput"
HELP = "energy to a target return, tuned by steps/J and by goodput/J, several seeds"
TRAIN_ARGS = (
    "--env-backend auto --policy auto:256:128:64:auto --lr 3e-4 "
    "--epochs 10 --minibatches 32 --min-minibatch 512 --entropy-coef 0 --lr-scaling none"
)
"""PPO's MuJoCo learner settings, minibatches of 512 samples at least (32 of 128 at batches of
4,096 stalled Ant-v5 near 800); the rate's schedule is the CLI's default (KL-steered)."""


OWN_FLAGS = frozenset(
    {"--tune", "--objective", "--target-return", "--seed", "--max-wall-s", "--env", "--quiet"}
    | {"--checkpoint", "--storage", "--study", "--progress", "--json", "--steps"}
)
"""``autotune train`` flags the suite sets itself, refused in ``--train-args``."""
STOP_AFTER_S = 120.0
"""A run still going this long past its ``--max-wall-s`` (which counts from its process's start,
probes included; its drain and exit come after) is stopped, its whole process group, and
counted failed."""


def add_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--env", default="Ant-v5")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--arms", default=",".join(ARMS), help=f"of {', '.join(ARMS)}")
    ap.add_argument("--target-return", type=float, default=1000.0)
    ap.add_argument("--max-wall-s", type=float, default=265.0, help="each run's wall budget")
    ap.add_argument(
        "--reference-return",
        type=float,
        default=None,
        help="a return to report the joules to as well (SB3 PPO's at 1M steps)",
    )
    ap.add_argument(
        "--train-args",
        default=TRAIN_ARGS,
        help=f"more `autotune train` flags, as one string (default: {TRAIN_ARGS!r}); not the "
        f"suite's own: {', '.join(sorted(OWN_FLAGS))}",
    )
    ap.add_argument(
        "--probe-cache",
        choices=("own", "shared"),
        default="own",
        help="own (default): each run probes its workload and compiles its loss afresh, as a "
        "first run does; shared: one cache for the suite's runs, so that the first run of a "
        "workload probes (its figures hold the probes) and the later ones read it, as a user's "
        "next run does; the report names the runs that read their probes",
    )
    ap.add_argument(
        "--sb3-window",
        type=float,
        default=0.0,
        metavar="S",
        help="first run SB3 PPO on this host, as `bench peers`' sb3-cpu arm (one env per core, "
        "the update on the CPU, the --policy of --train-args), metered over about S seconds "
        "after --sb3-warmup-s (its start-up left out); the report sets its joules for "
        "--sb3-steps against each run's joules to --reference-return (default 0: not run)",
    )
    ap.add_argument(
        "--sb3-warmup-s",
        type=float,
        default=10.0,
        help="SB3's training seconds left out before its window (default 10, as `bench peers`)",
    )
    ap.add_argument(
        "--sb3-steps",
        type=float,
        default=1e6,
        help="the steps SB3 PPO takes to reach --reference-return (default 1,000,000: the "
        "learning comparison's 390 on Ant-v5 is SB3's mean return at 1M steps)",
    )
    ap.add_argument("--markdown", default=None, metavar="FILE", help="report: the table")
    ap.add_argument("--plot", default=None, metavar="PNG", help="report: return vs joules")


def check(ap: argparse.ArgumentParser, a: argparse.Namespace) -> None:
    try:
        a.seed_list = [int(s) for s in a.seeds.split(",") if s.strip()]
    except ValueError:
        ap.error(f"--seeds {a.seeds!r}: expected integers, e.g. 0,1,2")
    if any(s < 0 for s in a.seed_list) or len(set(a.seed_list)) != len(a.seed_list):
        ap.error(f"--seeds {a.seeds!r}: distinct integers >= 0, e.g. 0,1,2")
    a.arm_list = [x.strip() for x in a.arms.split(",") if x.strip()]
    bad = [x for x in a.arm_list if x not in ARMS]
    if bad or not a.arm_list or not a.seed_list or len(set(a.arm_list)) != len(a.arm_list):
        ap.error(f"--arms {a.arms!r} / --seeds {a.seeds!r}: give seeds, and arms of {list(ARMS)}")
    if not a.max_wall_s > 0 or not math.isfinite(a.max_wall_s):
        ap.error(f"--max-wall-s {a.max_wall_s}: must be a number > 0")
    for flag, value in (
        ("--target-return", a.target_return),
        ("--reference-return", a.reference_return),
    ):
        if value is not None and not math.isfinite(value):
            ap.error(f"{flag} {value}: must be a finite number")
    sb3_args = (a.sb3_window, a.sb3_warmup_s, a.sb3_steps)
    if not all(math.isfinite(v) for v in sb3_args) or min(sb3_args) < 0 or not a.sb3_steps > 0:
        ap.error(
            f"--sb3-window {a.sb3_window}, --sb3-warmup-s {a.sb3_warmup_s}, --sb3-steps "
            f"{a.sb3_steps}: numbers, the first two >= 0, the last > 0"
        )
    try:
        a.policy = policy_of(a.train_args)
        flags = {f.split("=", 1)[0] for f in shlex.split(a.train_args) if f.startswith("--")}
    except ValueError as exc:
        ap.error(f"--train-args {a.train_args!r}: {exc} (quote it as a shell would)")
    # the suite's own flags, also as the abbreviations ``autotune train`` would take for them
    given = {f for f in flags if any(o.startswith(f) for o in OWN_FLAGS)}
    if given:
        ap.error(
            f"--train-args: {', '.join(sorted(given))} are (or abbreviate) the suite's own "
            f"flags ({', '.join(sorted(OWN_FLAGS))}); leave them out"
        )
    if a.sb3_window > 0 and importlib.util.find_spec("stable_baselines3") is None:
        ap.error(
            "--sb3-window runs SB3 PPO, which is not installed: pip install 'rl-autotune[sb3]'"
        )
    if a.sb3_window > 0 and (a.reference_return is None or a.policy is None):
        ap.error(
            "--sb3-window: give --reference-return (SB3's return at --sb3-steps) and a --policy "
            "in --train-args (SB3 builds the same MLP)"
        )


def policy_of(train_args: str) -> str | None:
    """The ``--policy`` of ``train_args`` (as ``--policy X`` or ``--policy=X``), else None."""
    args = shlex.split(train_args)
    for i, arg in enumerate(args):
        if arg.startswith("--policy="):
            return arg.split("=", 1)[1]
        if arg == "--policy" and i + 1 < len(args):
            return args[i + 1]
    return None


def sb3(a: argparse.Namespace) -> dict:
    """SB3 PPO on this host (``bench peers``' sb3-cpu arm), metered over ``--sb3-window``
    seconds after its first ``--sb3-warmup-s``; its document goes to ``OUT/sb3.json``."""
    from bench.report import write_json
    from bench.suites.peers import arm_step

    secs = a.sb3_warmup_s + a.sb3_window
    run = argparse.Namespace(env=a.env, policy=a.policy, seconds=secs, settle_s=0.0)
    run.__dict__.update(peer_rollout=2048, warmup_s=a.sb3_warmup_s, min_steps=0, tuned_s=secs)
    doc = arm_step("sb3", "sb3-cpu", run, Path(a.out) / "sb3", first=True)
    write_json(Path(a.out) / "sb3.json", doc)
    return doc


def run(a: argparse.Namespace, arm: str, seed: int) -> dict:
    """One tuned run to the target; its figures (``summary``), or ``failed`` with why."""
    from autotune.workflows.progress_log import read_progress

    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = out / f"{arm}-seed{seed}"
    for old in (".json", ".progress.jsonl", ".db", ".log", ".failed"):
        Path(f"{stem}{old}").unlink(missing_ok=True)  # a failed attempt's: this run starts afresh
    cmd = [sys.executable, "-m", "autotune.cli", "train", "--env", a.env]
    cmd += [*shlex.split(a.train_args), "--steps", "1000000000", "--tune"]
    cmd += ["--objective", ARMS[arm], "--target-return", str(a.target_return)]
    cmd += ["--max-wall-s", str(a.max_wall_s), "--seed", str(seed), "--quiet"]
    cmd += ["--storage", f"sqlite:///{stem.resolve()}.db", "--study", stem.name]
    cmd += ["--progress", f"{stem}.progress.jsonl", "--json", f"{stem}.json"]
    # own: each run probes its workload afresh, so that each pays a first run's start-up alike
    from bench.compare import cache_env, stop_group

    cache = out / (f"cache-{stem.name}" if a.probe_cache == "own" else "cache-shared")
    if a.probe_cache == "own":  # a retried run probes afresh too
        shutil.rmtree(cache, ignore_errors=True)
    env = cache_env(cache)

    with open(f"{stem}.log", "w") as log:
        proc = subprocess.Popen(
            cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env=env
        )
        try:
            code = proc.wait(timeout=a.max_wall_s + STOP_AFTER_S)
        except subprocess.TimeoutExpired:  # the whole run's process group, its actors too
            stop_group(proc)
            return _failed(stem, f"still running {a.max_wall_s + STOP_AFTER_S:.0f} s in")
        except BaseException:  # Ctrl-C, or the suite stopped: no run is left behind
            stop_group(proc)
            raise
    doc = _document(stem)
    if code != 0 or doc is None or doc.get("failed") or doc.get("failure"):
        tail = Path(f"{stem}.log").read_text()[-2000:]
        return {**_failed(stem, f"exit code {code}"), "returncode": code, "log_tail": tail}
    return summary(doc, read_progress(f"{stem}.progress.jsonl"), a.reference_return)


def _failed(stem: Path, why: str) -> dict:
    """A failed run, marked beside its files so that the report counts it failed even where
    it left a result document (a run stopped past its time drains and writes one)."""
    Path(f"{stem}.failed").write_text(why + "\n")
    return {"failed": True, "why": why}


def _document(stem: Path) -> dict | None:
    try:
        return json.loads(Path(f"{stem}.json").read_text())
    except (OSError, ValueError):
        return None


def report(a: argparse.Namespace, results: dict) -> dict:
    text = table(results, a.seed_list, a.arm_list, a.reference_return)
    sb3_doc = _document(Path(a.out) / "sb3") if a.sb3_window > 0 else None  # this command's
    text += against_sb3(results, sb3_doc, a.sb3_steps, a.reference_return)
    text += probes_note(results, a.probe_cache)
    if a.markdown:
        Path(a.markdown).parent.mkdir(parents=True, exist_ok=True)
        Path(a.markdown).write_text(text)
    print(text, flush=True)
    if a.plot:
        from bench.figure_goodput import return_vs_joules

        title = f"{a.env} to a return of {a.target_return:g}: tuned by steps/J and by goodput/J"
        label = f"SB3 PPO's return at {a.sb3_steps / 1e6:g}M steps"  # as --sb3-steps says
        return_vs_joules(
            Path(a.out),
            Path(a.plot),
            a.target_return,
            a.reference_return,
            title,
            a.seed_list,
            a.arm_list,
            label,
        )
    return {"table": text}


def plan(a: argparse.Namespace):
    steps = [
        Step(f"{arm}-seed{seed}", lambda arm=arm, seed=seed: run(a, arm, seed), a.max_wall_s + 45)
        for seed in a.seed_list
        for arm in a.arm_list
    ]
    if a.sb3_window > 0:  # once, before the runs, on the host they run on
        steps.insert(0, Step("sb3", lambda: sb3(a), a.sb3_warmup_s + a.sb3_window + 60))
    steps.append(Step("report", lambda: report(a, _results(a)), 30))
    return steps, None


def _results(a: argparse.Namespace) -> dict:
    """Every run's figures, read back from its result document and progress curve (runs of an
    earlier part included); a run marked failed (``_failed``), or whose document says it
    failed, is ``failed``."""
    from autotune.workflows.progress_log import read_progress

    out, found = Path(a.out), {}
    for seed in a.seed_list:
        for arm in a.arm_list:
            stem = out / f"{arm}-seed{seed}"
            doc, marked = _document(stem), Path(f"{stem}.failed").is_file()
            if doc is None and not marked:
                continue  # not run yet
            if marked or doc is None or doc.get("failed") or doc.get("failure"):
                found[stem.name] = {"failed": True}
                continue
            progress = read_progress(f"{stem}.progress.jsonl")
            found[stem.name] = summary(doc, progress, a.reference_return)
    return found
