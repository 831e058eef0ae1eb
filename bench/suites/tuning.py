"""Online tuning against the default config and a grid sweep of the same knobs; offline studies
(``autotune study``), their export, and the exported config re-measured beside the default.

    python -m bench tuning --env Ant-v5 --tune-s 510,390 --grid-s 330 --default-s 120 \\
        --state st --part-s 590 --out out/tuning
    python -m bench tuning --arms fixed --fixed tuned='{"actors": 16}' --fixed grid=... --out ...
    python -m bench tuning --arms study,export --study-preset cpu --workload humanoid --out ...

Arms (``--arms``, in the order given; each a step, or several):
  tune       ``train --tune``, one step per value of ``--tune-s`` (``tune1``, ``tune2``, ...):
             each part resumes the study on ``--storage`` (history, best) where the last stopped
  grid       ``train --tune --tune-sampler grid`` over a coarse lattice of the same knobs: every
             combination measured once, live, with the same warm-up and window (``--grid-s``)
  default    the CLI's default config, untuned (``--default-s``)
With ``--min-trials N`` the tune and grid arms run on past their seconds until their study
holds N more measured trials, and with ``--min-steps N`` the default arm until it trained N
steps after ``--skip-s``; then Ctrl-C drains them. A slow or loaded machine then gets longer
runs instead of runs that measured nothing.
  fixed      each ``--fixed LABEL=JSON`` (knob values as plain ``train`` flags) for
             ``--fixed-s``, ``--fixed-rounds`` times in turn (A B A B): the tuned best and the
             grid best re-measured side by side for the same span
  report     the figures and the plot from the arms' JSON files (``bench/online_tuning.py``):
             steps/J of the tuned run's final third, of the default run after ``--skip-s``, and
             of the grid's best window
  study      ``autotune study`` with the knobs of ``--study-preset``: ``gpu`` (Ant-v5, the GPU
             trainer's knobs, 40 s trials), ``cpu`` (the trainer on the CPU, the GPU left idle;
             ``--threads``, ``--precisions``; 35 s trials) or ``other`` (a workload's own study
             starting from ``--from``, 30 s trials; ``--reference-every``, ``--nice``)
  export     ``autotune export`` of that study, with its plots
  remeasure  ``train --config FILE`` (``--config``) vs the default, each ``--remeasure-s``,
             twice, interleaved
The studies' databases are under ``--out``; ``--workload`` picks the env and policy of the
``cpu`` and ``other`` presets.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from functools import partial
from pathlib import Path

from bench.suite import Step

NAME = "tuning"
HELP = "online tuning vs default vs grid; offline study, export and re-measure runs"
ARMS = ("tune", "grid", "default", "fixed", "report", "study", "export", "remeasure")
WORKLOADS = {
    "ant": ("Ant-v5", "auto:256:128:64:auto"),
    "halfcheetah": ("HalfCheetah-v5", "auto:256:128:64:auto"),
    "humanoid": ("Humanoid-v5", "auto:400:200:100:auto"),
    "ant-heavy": ("Ant-v5", "auto:1024:1024:512:auto"),
}
COMMON_KNOBS = ["--knob", "chunk_bytes=262144", "--knob", "rollout_len=32"]


def add_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--arms", default="tune,grid,default,report", help=", ".join(ARMS))
    ap.add_argument("--env", default="Ant-v5")
    ap.add_argument("--tune-s", default="300", help="the tuned run's parts, seconds each")
    ap.add_argument("--grid-s", type=float, default=300.0)
    ap.add_argument("--default-s", type=float, default=120.0)
    ap.add_argument(
        "--min-trials",
        type=int,
        default=0,
        help="the tune and grid arms run on past their seconds until their study holds this "
        "many more measured trials (a slow machine gets a longer run, not an empty one)",
    )
    ap.add_argument(
        "--min-steps",
        type=int,
        default=0,
        help="the default arm runs on past --default-s until it trained this many steps after "
        "--skip-s",
    )
    ap.add_argument("--fixed", action="append", default=None, metavar="LABEL=JSON")
    ap.add_argument("--fixed-s", type=float, default=100.0)
    ap.add_argument("--fixed-rounds", type=int, default=2)
    ap.add_argument("--storage", default=None, help="the online study (default OUT/tuning.db)")
    ap.add_argument("--trials", type=int, default=22, help="the online tuner's trials")
    ap.add_argument("--window-s", type=float, default=10.0, help="a window's least seconds")
    ap.add_argument(
        "--window-max-s",
        type=float,
        default=30.0,
        help="a window's most seconds (it ends sooner once its estimate is precise)",
    )
    ap.add_argument("--warmup-s", type=float, default=4.0)
    ap.add_argument(
        "--knob",
        action="append",
        default=None,
        help="replace the arm's knob list (smoke runs without a GPU)",
    )
    ap.add_argument(
        "--skip-s", type=float, default=30.0, help="report: the default run's start-up left out"
    )
    ap.add_argument("--plot", default=None, help="report: PNG path")
    s = ap.add_argument_group("study, export, remeasure")
    s.add_argument("--study-preset", default="gpu", choices=["gpu", "cpu", "other"])
    s.add_argument("--workload", default="ant", choices=list(WORKLOADS))
    s.add_argument("--study-trials", type=int, default=None, help="default 10 (cpu: 6)")
    s.add_argument("--confirm", type=int, default=None, help="default 2 (cpu), 3 (other)")
    s.add_argument("--from", dest="from_file", default=None, metavar="FILE")
    s.add_argument("--threads", default="1,2,4", help="cpu: trainer threads tried")
    s.add_argument("--precisions", default="fp32", help="cpu: trainer precisions tried")
    s.add_argument("--reference-every", type=int, default=0, help="other: re-run the start")
    s.add_argument("--nice", default=None, help="other: actors' niceness tried, e.g. 0,10")
    s.add_argument("--config", default=None, metavar="FILE", help="remeasure: the export")
    s.add_argument("--remeasure-s", type=float, default=100.0)


def check(ap: argparse.ArgumentParser, a: argparse.Namespace) -> None:
    a.arm_list = [x.strip() for x in a.arms.split(",") if x.strip()]
    bad = [x for x in a.arm_list if x not in ARMS]
    if bad or not a.arm_list:
        ap.error(f"--arms: unknown {bad or 'nothing given'}; allowed {', '.join(ARMS)}")
    try:
        a.tune_parts = [float(x) for x in a.tune_s.split(",")]
    except ValueError:
        ap.error(f"--tune-s {a.tune_s!r}: expected seconds, e.g. 510,390")
    if min([*a.tune_parts, a.grid_s, a.default_s, a.fixed_s, a.remeasure_s]) <= 0:
        ap.error("--tune-s, --grid-s, --default-s, --fixed-s and --remeasure-s must be > 0")
    if a.min_trials < 0 or a.min_steps < 0:
        ap.error("--min-trials and --min-steps must be >= 0 (0: the seconds alone)")
    a.fixed_values = {}
    for spec in a.fixed or []:
        label, sep, text = spec.partition("=")
        try:
            a.fixed_values[label] = json.loads(text) if sep and label.isidentifier() else None
        except ValueError:
            a.fixed_values[label] = None
        if not isinstance(a.fixed_values[label], dict):
            ap.error(f"--fixed {spec!r}: expected LABEL=JSON, e.g. tuned='{{\"actors\": 16}}'")
    if "fixed" in a.arm_list and not a.fixed_values:
        ap.error("the fixed arm needs --fixed LABEL=JSON (repeatable)")
    if "remeasure" in a.arm_list and not (a.config and Path(a.config).is_file()):
        ap.error(f"the remeasure arm needs --config FILE (an existing export), not {a.config!r}")
    a.storage = a.storage or f"sqlite:///{Path(a.out).resolve()}/tuning.db"


def confirm_trials(a: argparse.Namespace) -> int:
    """The study's confirmation trials: ``--confirm``, else 2 (cpu), 3 (other), none (gpu)."""
    if a.study_preset == "gpu":
        return 0
    if a.confirm is not None:
        return a.confirm
    return 2 if a.study_preset == "cpu" else 3


def study_command(a: argparse.Namespace, out: Path) -> tuple[str, str, list[str], int, float]:
    """(study name, storage, the `autotune study` command, trials, seconds per trial); its
    JSON is ``OUT/<study name>.json``."""
    env, policy = WORKLOADS[a.workload]
    db = f"sqlite:///{out.resolve()}"
    py = [sys.executable, "-m", "autotune.cli", "study"]
    if a.study_preset == "gpu":
        name, trials, trial_s = "ant-study", a.study_trials or 10, 40.0
        storage = f"{db}/study.db"
        cmd = [*py, "--env", "Ant-v5", "--study", name, "--storage", storage]
        cmd += ["--trials", str(trials), "--trial-s", "40", "--warmup-s", "10"]
        knobs = "actors=2..16 envs_per_actor=8..64 batch_size=1024..16384 trainers=1,2"
        knobs += " mps_pct=25,50,100 inference=actor,gmi trainer_device=cuda"
        cmd += [x for k in knobs.split() for x in ("--knob", k)]
        cmd += ["--knob", "chunk_bytes=262144", "--knob", "trainer_threads=1"]
        cmd += ["--knob", "rollout_len=32"]
    elif a.study_preset == "cpu":
        name, trials, trial_s = f"{a.workload}-study-cpu", a.study_trials or 6, 35.0
        storage = f"{db}/study-cpu-{a.workload}.db"
        cmd = [*py, *(["--from", a.from_file] if a.from_file else [])]
        cmd += ["--env", env, "--study", name, "--storage", storage, "--policy", policy]
        cmd += ["--trials", str(trials), "--confirm", str(confirm_trials(a))]
        cmd += ["--trial-s", "35", "--warmup-s", "10", "--no-profile"]
        knobs = f"trainer_device=cpu actors=11..15 trainer_threads={a.threads}"
        knobs += " envs_per_actor=16,32,64 batch_size=8192,16384,32768 trainers=1 mps_pct=100"
        knobs += f" trainer_precision={a.precisions} inference=actor"
        cmd += [x for k in knobs.split() for x in ("--knob", k)] + COMMON_KNOBS
    else:
        name, trials, trial_s = f"study-{a.workload}", a.study_trials or 10, 30.0
        storage = f"{db}/study-{a.workload}.db"
        start = a.from_file or "bench/exports/ant-export.json"
        cmd = [*py, "--from", start, "--env", env, "--study", name, "--storage", storage]
        cmd += ["--policy", policy, "--trials", str(trials), "--confirm", str(confirm_trials(a))]
        cmd += ["--trial-s", "30", "--warmup-s", "8", "--no-profile"]
        cmd += ["--reference-every", str(a.reference_every)]
        cmd += ["--knob", f"actor_nice={a.nice}"] if a.nice else []
        knobs = "actors=11..15 envs_per_actor=16,32,64 batch_size=8192,16384,32768"
        knobs += " trainers=1,2 mps_pct=50,100 inference=actor,gmi trainer_device=cuda"
        knobs += " trainer_threads=1"
        cmd += [x for k in knobs.split() for x in ("--knob", k)] + COMMON_KNOBS
    cmd += ["--json", str(out / f"{name}.json")]
    return name, storage, cmd, trials, trial_s


def export_names(preset: str, workload: str) -> tuple[str, str]:
    """The export's file and its plots' directory, under ``--out``."""
    if preset == "cpu":
        return f"{workload}-export-cpu.json", f"plots-cpu-{workload}"
    w = "ant" if preset == "gpu" else workload
    return f"{w}-export.json", f"plots-{w}"


def export_command(a: argparse.Namespace, out: Path) -> list[str]:
    """The `autotune export` of the study of ``--study-preset``, with its plots."""
    name, storage, *_ = study_command(a, out)
    file, plots = export_names(a.study_preset, a.workload)
    cmd = [sys.executable, "-m", "autotune.cli", "export", "--study", name, "--storage", storage]
    return [*cmd, "--out", str(out / file), "--plots", str(out / plots)]


def _run(cmd: list[str]) -> dict:
    print(" ".join(cmd), flush=True)
    rc = subprocess.run(cmd).returncode
    return {"command": cmd, "returncode": rc, "failed": rc != 0}


def plan(a: argparse.Namespace):
    from bench import online_tuning as ot

    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)

    def train(seconds: float, name: str, extra: list[str], study: str | None = None) -> dict:
        until = None
        if study is not None and a.min_trials:
            start = ot.complete_trials(a.storage, study)

            def until() -> bool:
                return ot.complete_trials(a.storage, study) >= start + a.min_trials

        elif name == "default" and a.min_steps:
            progress = out / "default.progress.jsonl"
            extra = [*extra, "--progress", str(progress)]

            def until() -> bool:
                return ot.trained_past(progress, a.skip_s, a.min_steps)

        rc = ot.train(a, seconds, out / f"{name}.json", extra, until)
        return {"json": str(out / f"{name}.json"), "returncode": rc, "failed": rc != 0}

    def report() -> dict:
        doc = ot.report(a, out)
        print(json.dumps(doc, indent=2))
        return doc

    steps: list[Step] = []
    for arm in a.arm_list:
        if arm == "tune":
            study = f"tune-{a.env}"
            extra = ot.tune_args(a, ot.TUNE_KNOBS, study)
            for k, secs in enumerate(a.tune_parts, 1):
                run = partial(train, secs, f"tune{k}", extra, study)
                steps.append(Step(f"tune{k}", run, secs + 30))
        elif arm == "grid":
            study = f"grid-{a.env}"
            extra = [*ot.tune_args(a, ot.GRID_KNOBS, study), "--tune-sampler", "grid"]
            run = partial(train, a.grid_s, "grid", extra, study)
            steps.append(Step("grid", run, a.grid_s + 30))
        elif arm == "default":
            steps.append(
                Step("default", lambda: train(a.default_s, "default", []), a.default_s + 30)
            )
        elif arm == "fixed":
            for k in range(1, a.fixed_rounds + 1):
                for label, values in a.fixed_values.items():
                    name = f"fixed-{label}-{k}"
                    run = partial(train, a.fixed_s, name, ot.fixed_flags(values))
                    steps.append(Step(name, run, a.fixed_s + 30))
        elif arm == "report":
            steps.append(Step("report", report, 30))
        elif arm in ("study", "export"):
            _, _, cmd, trials, trial_s = study_command(a, out)
            if arm == "study":
                est = (trials + confirm_trials(a)) * (trial_s + 15) + 60
                steps.append(Step("study", lambda c=cmd: _run(c), est))
            else:
                export = export_command(a, out)
                steps.append(Step("export", lambda c=export: _run(c), 60))
        else:
            for k in (1, 2):
                for label, flags in (("default", ["--env", "Ant-v5"]), ("exported", [])):
                    if label == "exported":
                        flags = ["--config", a.config]
                    cmd = [sys.executable, "-m", "autotune.cli", "train", *flags]
                    cmd += ["--steps", "1000000000", "--max-wall-s", str(a.remeasure_s)]
                    cmd += ["--quiet", "--json", str(out / f"{label}-{k}.json")]
                    steps.append(
                        Step(f"remeasure-{label}-{k}", lambda c=cmd: _run(c), a.remeasure_s + 30)
                    )
    return steps, None
