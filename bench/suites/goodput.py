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
afresh (a probe cache of its own), so that every run pays a first run's start-up alike. A run
stops at the first 100-episode mean of at least R, or at W seconds (then it did not get there;
its best return is kept, and what it spent).

Step ``report``: per run the joules, seconds and trained steps to the target, its whole-run
steps/J, where it first reached ``--reference-return`` (SB3 PPO's 1M-step return on the page);
per seed, the steps/J run's joules over the goodput run's (or a bound); the plot.
"""

from __future__ import annotations

import argparse
import json
import math
import shlex
import subprocess
import sys
from pathlib import Path

from bench.suite import Step
from runtime.telemetry import RETURN_WINDOW

NAME = "goodput"
HELP = "energy to a target return, tuned by steps/J and by goodput/J, several seeds"
ARMS = {"steps-per-joule": "steps_per_joule", "goodput": "goodput_per_joule"}
"""File stem of each tuning (as ``bench.figure_goodput`` reads them) -> its objective."""
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
    try:
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
    # each run probes its workload afresh, so that each pays a first run's start-up alike
    from bench.compare import cache_env, stop_group

    env = cache_env(out / f"cache-{stem.name}")

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


def summary(doc: dict, progress: list[dict], reference: float | None) -> dict:
    """A run's figures from its result document and progress lines."""
    first = next(
        (
            r
            for r in progress
            if reference is not None
            and r.get("return") is not None
            and r.get("episodes", 0) >= RETURN_WINDOW  # a mean of as many as the target's
            and r["return"] >= reference
        ),
        None,
    )
    target = doc.get("target") or {}
    passed = target.get("reached") and reference is not None and target.get("return") is not None
    if passed and reference <= target["return"]:
        # the mean passed the reference by the time it reached the target, between two
        # progress lines (a second apart) where both came within one
        at = {"joules": target["joules"], "steps": target["steps"]}
        if first is None or (first.get("joules") or 0.0) > at["joules"]:
            first = at
    return {
        "target": doc.get("target"),
        "spent_joules": spent_joules(doc),
        "trained_steps": doc["env_steps"],
        "wall_s": doc["wall_s"],
        "steps_per_joule": doc.get("steps_per_joule"),
        "lost_steps": doc["lost_steps"],
        "env_backend": (doc.get("config") or {}).get("env_backend"),  # what `auto` resolved to
        "learning_rate": {  # the schedule, and where it ended (the adaptive one moves it)
            k: (doc.get("learning_rate") or {}).get(k) for k in ("schedule", "last", "last_kl")
        },
        "policy_lag_mean": (doc.get("policy_lag") or {}).get("mean"),
        "reference": None
        if first is None
        else {
            "return": reference,
            "joules": first.get("joules"),
            "steps": first["steps"],
            "efficient_samples": efficient_samples(doc, progress, first["steps"]),
        },
        "efficient_samples": efficient_samples(doc, progress, target["steps"])
        if target.get("reached") and target.get("steps") is not None
        else None,
    }


def spent_joules(doc: dict) -> float | None:
    """The joules a run spent in all, from its process's start (the sizing's probes, and the
    runs it went on from, counted as a reached target counts them): its target's ``spent``,
    or, in a document from before that was kept, its energy window plus the sizing's."""
    target = doc.get("target") or {}
    if (target.get("spent") or {}).get("joules") is not None:
        return float(target["spent"]["joules"])
    energy = doc.get("energy") or {}
    if "gpu_j" not in energy or target.get("earlier_runs"):
        return None  # not known how much came before
    sizing = (target.get("sizing") or {}).get("joules") or 0.0
    return float(energy["gpu_j"]) + float(energy.get("cpu_j") or 0.0) + float(sizing)


def batches_in_use(doc: dict) -> list[tuple[float, int]]:
    """A run's batch size over time, as its tuner applied it: ``(unix time, batch)`` from its
    start (the sized or given batch) through each change in ``changes`` (left out where the
    document has no ``timeline`` to place them); empty where it does not say its first batch."""
    start = (doc.get("timeline") or {}).get("started_unix")
    first = ((doc.get("sizing") or {}).get("values") or {}).get("batch_size")
    first = first or ((doc.get("tuning") or {}).get("default") or {}).get("batch_size")
    first = first or (doc.get("config") or {}).get("batch_size")
    if not first:
        return []
    out = [(float("-inf"), int(first))]
    changes = (doc.get("changes") or []) if start is not None else []  # times from the start
    for change in changes:
        if "batch_size" in (change.get("changed") or {}):
            out.append((start + change["t"], int(change["changed"]["batch_size"])))
    return out


def efficient_samples(doc: dict, progress: list[dict], upto: int) -> float | None:
    """The trained steps up to ``upto``, each weighed by the efficiency of the batch in use at
    the noise scale its progress line reported (``policies.noise_scale.efficiency``, what the
    goodput objective counts): McCandlish et al.'s ``E_min``, the samples a tiny batch would
    have needed for the same progress if the model holds. Steps before a run's first estimate
    count at it, steps after its last at that one (a target is reached between two lines).
    None where no line has an estimate, or the document does not say the run's first batch."""
    from policies.noise_scale import efficiency

    batches, total, counted, last = batches_in_use(doc), 0.0, 0, None
    for row in progress:
        noise = row.get("noise_scale")
        if noise is None or not batches:
            continue
        batch = next(b for t, b in reversed(batches) if row["t"] >= t)
        last = efficiency(noise, batch) or 0.0
        steps = min(row["steps"], upto)
        total += (steps - counted) * last
        counted = max(counted, steps)
        if steps >= upto:
            break
    if last is None:
        return None
    return total + max(upto - counted, 0) * last  # past the last line, at its estimate


def table(results: dict, seeds: list[int], arms: list[str], reference: float | None) -> str:
    """The markdown table of the runs, and per seed the steps/J run's joules over goodput's."""
    head = "| tuned by | seed | to the target: joules | seconds | trained steps | steps/J |"
    rows = [head + (f" return {reference:g} reached at |" if reference is not None else "")]
    rows.append("|---|---:|---:|---:|---:|---:|" + ("---:|" if reference is not None else ""))
    joules: dict[tuple[str, int], float] = {}
    for seed in seeds:
        for arm in arms:
            r = results.get(f"{arm}-seed{seed}") or {}
            if r.get("failed") or not r:
                rows.append(f"| {arm} | {seed} | failed | | | |")
                continue
            t = r["target"] or {}
            if t.get("reached"):
                joules[(arm, seed)] = t["joules"]
                sizing = t.get("sizing")  # its probes' share, where the run was sized
                of = f" ({sizing['joules'] / 1000:.1f} kJ sizing)" if sizing else ""
                to = f"**{t['joules'] / 1000:.1f} kJ**{of} | {t['seconds']:.1f} | {t['steps']:,}"
            else:
                best = t.get("best_return")  # None before a 100-episode mean
                to = f"not reached (best {'n/a' if best is None else f'{best:.0f}'}) | | "
                to += f"{r['trained_steps']:,}"
            ref = r.get("reference")
            tail = "" if reference is None else " not reached |"
            if ref:
                kj = "n/a" if ref["joules"] is None else f"{ref['joules'] / 1000:.1f} kJ"
                tail = f" {kj}, {ref['steps'] / 1e6:.2f}M steps |"
            rows.append(f"| {arm} | {seed} | {to} | {r['steps_per_joule'] or 0:.1f} |{tail}")
    ran = [r for r in results.values() if r and not r.get("failed")]
    backends = sorted({str(r.get("env_backend")) for r in ran})
    rows.append(f"\nThe actors' env backend: {', '.join(backends) or 'n/a'}.")
    rows.append(_learning_rates(ran))
    rows.append(_efficient(results, arms, reference))
    if set(arms) != set(ARMS):
        return "\n".join(rows) + "\n"
    note = ", ".join(_ratios(results, seeds, joules)) or "n/a (no seed gives a ratio or a bound)"
    return "\n".join(rows) + f"\n\nsteps/J-tuned joules over goodput-tuned, per seed: {note}\n"


def _ratios(results: dict, seeds: list[int], joules: dict[tuple[str, int], float]) -> list[str]:
    """Per seed, the steps/J run's joules to the target over the goodput run's; where one of
    the two stopped short of the target, a bound from what it spent in all (a run that missed
    would have needed more than it spent)."""
    out = []
    for s in seeds:
        sj, gp = joules.get(("steps-per-joule", s)), joules.get(("goodput", s))
        if sj is not None and gp is not None:
            out.append(f"{sj / gp:.2f}x (seed {s})")
            continue
        missed = results.get(f"{'steps-per-joule' if sj is None else 'goodput'}-seed{s}") or {}
        spent = None if (sj is None) == (gp is None) else missed.get("spent_joules")
        if spent is None:
            continue  # both missed it, or the one that missed failed or did not say
        if sj is None:  # it would have needed more than it spent
            out.append(f"more than {spent / gp:.2f}x (seed {s}: steps/J missed it)")
        else:
            out.append(f"less than {sj / spent:.2f}x (seed {s}: goodput missed it)")
    return out


def _efficient(results: dict, arms: list[str], reference: float | None) -> str:
    """A line giving each tuning's range of ``efficient_samples`` to the target and to the
    reference return: where the goodput objective's model holds, equal across tunings."""

    def span(arm: str, key: str | None) -> str:
        runs = [r for k, r in results.items() if k.startswith(f"{arm}-seed") and r]
        got = [(r.get(key) or {}) if key else r for r in runs if not r.get("failed")]
        vals = [g["efficient_samples"] for g in got if g.get("efficient_samples") is not None]
        return f"{arm} {min(vals) / 1e6:.2f}-{max(vals) / 1e6:.2f}M" if vals else f"{arm} n/a"

    to = [("the target", None)] + ([(f"{reference:g}", "reference")] if reference else [])
    parts = [f"to {name}: " + ", ".join(span(arm, key) for arm in arms) for name, key in to]
    what = "what the goodput objective counts; equal across tunings where its model holds"
    return f"Samples weighed by the efficiency of the batch in use ({what}): {'; '.join(parts)}."


def _learning_rates(ran: list[dict]) -> str:
    """A line naming the runs' learning-rate schedules and the range of their last rates."""
    rates = [r.get("learning_rate") or {} for r in ran]
    schedules = sorted({str(lr.get("schedule")) for lr in rates if lr.get("schedule")})
    last = [lr["last"] for lr in rates if isinstance(lr.get("last"), int | float)]
    span = f" (the last rates {min(last):.2g} to {max(last):.2g})" if last else ""
    return f"The learning-rate schedule: {', '.join(schedules) or 'n/a'}{span}."


def report(a: argparse.Namespace, results: dict) -> dict:
    text = table(results, a.seed_list, a.arm_list, a.reference_return)
    if a.markdown:
        Path(a.markdown).parent.mkdir(parents=True, exist_ok=True)
        Path(a.markdown).write_text(text)
    print(text, flush=True)
    if a.plot:
        from bench.figure_goodput import return_vs_joules

        title = f"{a.env} to a return of {a.target_return:g}: tuned by steps/J and by goodput/J"
        return_vs_joules(
            Path(a.out), Path(a.plot), a.target_return, a.reference_return, title, a.seed_list
        )
    return {"table": text}


def plan(a: argparse.Namespace):
    steps = [
        Step(f"{arm}-seed{seed}", lambda arm=arm, seed=seed: run(a, arm, seed), a.max_wall_s + 45)
        for seed in a.seed_list
        for arm in a.arm_list
    ]
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
