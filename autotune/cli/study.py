"""``autotune study``: offline tuning, one fresh run per trial (see
``autotune.tuning.offline_study``)."""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

from autotune.cli.output import write_json
from autotune.tuning.knobs import KnobError

if TYPE_CHECKING:
    from autotune.tuning.offline_study import OfflineStudy
    from autotune.workflows.study import StudyOptions


def add_study_command(sub: Any) -> None:
    study = sub.add_parser(
        "study",
        help="offline tuning: many short runs, one fresh run per trial, kept in an Optuna study",
        description="Runs short 'autotune train' jobs (or, after --, a wrapped script) with "
        "configs chosen on Optuna: the default config first, then GMI-DRL's profiling (trainer "
        "GMIs x envs per actor, each row stopped at saturation, unrunnable configs skipped), "
        "then TPE over the whole knob space, restart-only knobs included. Each trial's steps/s "
        "and steps/J (measured after --warmup-s) are kept in an RDB study (SQLite or "
        "PostgreSQL) that resumes when run again and opens in optuna-dashboard.",
        epilog="examples: autotune study --env Ant-v5 --trials 30 --trial-s 60 --warmup-s 15 | "
        "autotune study --objective both --storage postgresql://user:pw@host/db | "
        "autotune study --knob num_envs=1,2,4,8 --trials 8 -- python examples/ppo_gymnasium.py",
    )
    study.add_argument(
        "--env",
        default=None,
        help="gymnasium env id (default: the --from "
        "config's, else CartPole-v1; not used with -- CMD)",
    )
    study.add_argument(
        "--from",
        dest="from_config",
        default=None,
        metavar="FILE",
        help="start from this config (an 'autotune export' file, a 'train "
        "--json' result or a config mapping): every trial runs it with the "
        "knobs' values, and the first trial runs it as it is, values outside "
        "the knobs' choices included (a knob with one value, from --knob or "
        "the cores, runs at that value; the study says so); --env and "
        "--policy, if given, replace its own",
    )
    study.add_argument(
        "--trials",
        type=int,
        default=20,
        help="trials to run now, all workers together (default 20)",
    )
    study.add_argument(
        "--trial-s",
        "--timeout",
        type=float,
        default=30.0,
        dest="trial_s",
        help="the longest a trial run lasts, in wall seconds (default 30); a train trial "
        "ends sooner once its window's steps/J is known to +/-3 %% (at least 10 s after "
        "--warmup-s)",
    )
    study.add_argument(
        "--warmup-s",
        type=float,
        default=10.0,
        help="seconds after a run's first trained step left out of its figures "
        "(default 10; train trials)",
    )
    study.add_argument(
        "--knob",
        action="append",
        default=None,
        metavar="NAME=SPEC",
        help="fix or narrow a knob, as for train --tune; with -- CMD, the "
        "script's knobs as for wrap (repeatable)",
    )
    study.add_argument(
        "--objective",
        choices=["steps_per_joule", "steps_per_s", "both", "goodput_per_joule", "joules_to_target"],
        default="steps_per_joule",
        help="what to maximise; both: steps/s and steps/J, a multi-objective "
        "study with a Pareto front; goodput_per_joule: steps/J times the "
        "statistical efficiency of the batch at the learner's gradient noise "
        "scale; joules_to_target: the fewest joules to --target-return "
        "(default steps_per_joule)",
    )
    study.add_argument(
        "--target-return",
        type=float,
        default=None,
        metavar="R",
        help="with --objective joules_to_target: each trial runs until its "
        "100-episode mean return reaches R, or --trial-s (then it scores 0 "
        "and keeps its best return); configs are ranked by the joules to R, "
        "start-up included",
    )
    study.add_argument(
        "--confirm",
        type=int,
        default=0,
        metavar="K",
        help="the last K of --trials re-measure the best configs so far, so "
        "a lucky short trial is measured again before export picks it "
        "(default 0)",
    )
    study.add_argument(
        "--reference-every",
        type=int,
        default=0,
        metavar="K",
        help="run the default (or --from) config again first in each "
        "session and then after every K trials (counted in --trials; during "
        "the confirmations only the first), and rank every trial by its figures "
        "scaled to the "
        "machine state of the study's first run: for a shared machine that "
        "drifts over minutes; one process only (not with --workers) (default 0: "
        "never)",
    )
    study.add_argument(
        "--no-profile",
        action="store_true",
        help="skip the profiling seeds (train runs profile by default)",
    )
    study.add_argument(
        "--workers",
        type=int,
        default=1,
        help="trials run at once on this machine, each worker on its own slice "
        "of the cores (and its own GPU); run more workers on other machines with "
        "the same --storage and --study (default 1)",
    )
    study.add_argument(
        "--cluster",
        default=None,
        metavar="ADDRESS",
        help="run the --workers as Ray tasks on a cluster's nodes (auto, ray://HOST:PORT or "
        "local:N; pip install 'rl-autotune[cluster]'); needs --worker-cpus and, beyond "
        "local:N, a --storage every node reaches (PostgreSQL)",
    )
    study.add_argument(
        "--worker-cpus", type=int, default=0, help="with --cluster: CPUs per worker (K >= 1)"
    )
    study.add_argument(
        "--worker-gpus",
        type=int,
        default=0,
        choices=(0, 1),
        help="with --cluster: 1 gives each worker a GPU of its own (default 0)",
    )
    study.add_argument(
        "--policy", default=None, help="MLP spec (default: the --from config's, else auto)"
    )
    study.add_argument(
        "--report-timeout-s",
        type=float,
        default=60.0,
        help="-- CMD: a run silent this long after its first report is hung (default 60)",
    )
    study.add_argument(
        "--storage",
        default="sqlite:///autotune.db",
        help="Optuna RDB storage URL: sqlite:///FILE (default "
        "sqlite:///autotune.db) or postgresql://USER:PASSWORD@HOST/DB",
    )
    study.add_argument(
        "--study", default=None, help="study name (default study-<env>, or study-<script name>)"
    )
    study.add_argument(
        "--seed",
        type=int,
        default=None,
        help="sampler and run seed (default: the --from config's, else 0)",
    )
    study.add_argument(
        "--json",
        type=Path,
        default=None,
        metavar="PATH",
        help="write this session's trials and the best config to PATH",
    )
    study.add_argument("cmd", nargs=argparse.REMAINDER, help="-- CMD ARGS... (a wrapped script)")
    study.set_defaults(func=cmd_study)


def study_options(args: argparse.Namespace) -> StudyOptions:
    """The resolved ``StudyOptions`` of parsed ``autotune study`` flags.

    Raises:
        ValueError: saying which settings are wrong and what is allowed.
    """
    from autotune.workflows.study import StudyOptions, resolve_options  # optuna

    return resolve_options(
        StudyOptions(
            env=args.env,
            policy=args.policy,
            seed=args.seed,
            from_config=args.from_config,
            trials=args.trials,
            trial_s=args.trial_s,
            warmup_s=args.warmup_s,
            knobs=tuple(args.knob or ()),
            objective=args.objective,
            target_return=args.target_return,
            confirm=args.confirm,
            reference_every=args.reference_every,
            profile=not args.no_profile,
            workers=args.workers,
            cluster=args.cluster,
            worker_cpus=args.worker_cpus,
            worker_gpus=args.worker_gpus,
            report_timeout_s=args.report_timeout_s,
            storage=args.storage,
            study=args.study,
            cmd=tuple(args.cmd),
        )
    )


def cmd_study(args: argparse.Namespace) -> int:
    # optuna and the runtime: imported by the command that needs them, not by every command
    # optuna, through the tuning layer: imported by this command only
    from autotune.tuning.storage import StudyError
    from autotune.workflows.study import from_notes, summary
    from autotune.workflows.study_run import prepare, run_trials

    console = Console(stderr=True, emoji=False)
    try:
        options = study_options(args)
        offline, plan = prepare(options)
    except (KnobError, StudyError, ValueError) as exc:
        console.print(f"[red]error:[/red] {escape(str(exc))}")
        return 2
    for note in from_notes(options, offline):
        console.print(f"[yellow]note:[/yellow] {escape(note)}")
    progress = Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total} trials"),
        TextColumn("{task.fields[best]}"),
        TimeRemainingColumn(),
        console=console,
    )
    rows: list[dict[str, Any]] = []
    with progress:
        task = progress.add_task(f"study {offline.study.study_name}", total=args.trials, best="")

        def done(row: dict[str, Any]) -> None:
            rows.append(row)
            progress.console.print(describe(row))
            progress.update(task, advance=1, best=best_text(offline))

        try:
            interrupted = run_trials(options, offline, plan, done, say=progress.console.print)
        except ValueError as exc:  # the cluster unreachable, or too small for the workers
            console.print(f"[red]error:[/red] {escape(str(exc))}")
            return 2
    doc = {
        "study": offline.study.study_name,
        "objective": args.objective,
        "trials": rows,
        "interrupted": interrupted,
        **summary(offline.study, args.objective),
    }
    if interrupted:
        console.print("[red]interrupted[/red]: the study is consistent; rerun to go on")
    console.print(best_text(offline) or "no trial completed")
    write_json(args.json, doc)
    return 130 if interrupted else (0 if doc["best"] is not None else 1)


def describe(row: dict[str, Any]) -> str:
    head = f"trial {row['number']} ({row['role']}) {row['values']}"
    if row.get("worker") is not None:
        head = f"[w{row['worker']}] {head}"
    if row["error"]:
        return f"{head}: [red]{escape(str(row['error']))}[/red]"
    text = f"{head}: {row['steps_per_s']:,.0f} steps/s, {row['steps_per_joule'] or 0:.4g} steps/J"
    scaled = row["attrs"].get("scaled_steps_per_joule")
    if scaled and row["steps_per_joule"] and abs(scaled / row["steps_per_joule"] - 1) > 1e-9:
        text += f" (scaled {scaled:.4g} by reference trial {row['attrs']['reference_trial']})"
    return text + target_text(row["attrs"])


def target_text(attrs: dict[str, Any]) -> str:
    """A run to a target return: what it took, or its best return short of it."""
    if attrs.get("target_return") is None:
        return ""
    if attrs.get("reached"):
        return (
            f"; return {attrs['target_return']:g} reached in {attrs['joules_to_target']:,.0f} J, "
            f"{attrs['seconds_to_target']:.1f} s, {attrs['steps_to_target']:,} steps"
        )
    best = attrs.get("best_return")
    best_s = "no 100-episode mean yet" if best is None else f"best return {best:.4g}"
    return f"; return {attrs['target_return']:g} not reached ({best_s})"


def best_text(offline: OfflineStudy) -> str:
    from autotune.tuning.study_best import best_trial, config_values, pareto_front  # optuna

    if len(offline.metrics) > 1:
        front = pareto_front(offline.study)
        return f"Pareto front: {len(front)} trials" if front else ""
    best = best_trial(offline.study)
    if best is None:
        return ""
    shown = {**best.params, **(best.user_attrs.get("given") or {})}  # run as given: no params
    if best.user_attrs.get("target_return") is not None:
        return f"best: trial {best.number} {shown}{target_text(best.user_attrs)}"
    values = config_values(offline.study, best)
    if len(values) == 1:
        return f"best: trial {best.number} {shown} -> {best.value:.4g} (its config's only trial)"
    mid = statistics.median(values)
    return f"best: trial {best.number} {shown} -> {mid:.4g} (median of its config's {len(values)})"
