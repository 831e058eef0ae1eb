"""``autotune study --env ENV --trials N``: offline tuning, one fresh run per trial."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any


def add_study_command(sub: Any) -> None:
    study = sub.add_parser(
        "study",
        help="offline tuning: many short training runs, one fresh run per trial, kept in an "
        "Optuna study",
        description="Runs short 'autotune train' jobs with configs chosen by Optuna (TPE) over "
        "the knob space, restart-only knobs included, and keeps each trial's steps/s and "
        "steps/J (measured after --warmup-s) in an RDB study that resumes when run again.",
    )
    study.add_argument("--env", default="CartPole-v1", help="gymnasium env id")
    study.add_argument("--trials", type=int, default=20, help="trials to run now (default 20)")
    study.add_argument("--trial-s", type=float, default=30.0,
                       help="wall seconds per trial run (default 30)")  # fmt: skip
    study.add_argument("--warmup-s", type=float, default=10.0,
                       help="seconds of each run left out of its figures (default 10)")  # fmt: skip
    study.add_argument("--knob", action="append", default=None, metavar="NAME=SPEC",
                       help="fix or narrow a knob, as for train --tune (repeatable)")  # fmt: skip
    study.add_argument("--objective", choices=["steps_per_joule", "steps_per_s"],
                       default="steps_per_joule", help="what to maximise")  # fmt: skip
    study.add_argument("--policy", default="auto", help="MLP spec (default auto)")
    study.add_argument("--storage", default="sqlite:///autotune.db",
                       help="Optuna RDB storage URL (default sqlite:///autotune.db)")  # fmt: skip
    study.add_argument("--study", default=None, help="study name (default study-<env>)")
    study.add_argument("--seed", type=int, default=0, help="sampler and run seed (default 0)")
    study.add_argument("--json", type=Path, default=None, metavar="PATH",
                       help="write this session's trials and the best config to PATH")  # fmt: skip
    study.set_defaults(func=cmd_study)


def cmd_study(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

    from autotune.cli import write_json
    from autotune.knobs import KnobError, Machine, build_space
    from autotune.offline import OfflineStudy
    from autotune.study import StudyError, best_trial, open_study
    from runtime.config import TrainConfig

    console = Console(stderr=True)
    try:
        if args.trials < 1 or not args.trial_s > args.warmup_s >= 0:
            raise ValueError(f"--trials {args.trials}, --trial-s {args.trial_s}, "
                             f"--warmup-s {args.warmup_s}: need trials >= 1 and "
                             "trial-s > warmup-s >= 0")  # fmt: skip
        space = build_space(Machine.here(), args.knob)
        base = TrainConfig(env=args.env, steps=10**12, policy=args.policy, seed=args.seed,
                           max_wall_s=args.trial_s)  # fmt: skip
        study = open_study(args.storage, args.study or f"study-{args.env}",
                           seed=args.seed)  # fmt: skip
        offline = OfflineStudy(study, space, base, args.warmup_s, args.objective)
    except (KnobError, StudyError, ValueError) as exc:
        console.print(f"[red]error:[/red] {exc}")
        return 2
    rows, interrupted = [], False
    progress = Progress(TextColumn("{task.description}"), BarColumn(),
                        TextColumn("{task.completed}/{task.total} trials"),
                        TextColumn("best {task.fields[best]}"), TimeRemainingColumn(),
                        console=console)  # fmt: skip
    with progress:
        task = progress.add_task(f"study {study.study_name}", total=args.trials, best="-")
        try:
            for _ in range(args.trials):
                row = offline.step()
                rows.append(row.__dict__)
                if row.error:
                    progress.console.print(
                        f"trial {row.number} {row.values}: [red]{row.error}[/red]"
                    )
                else:
                    progress.console.print(f"trial {row.number} {row.values}: "
                                           f"{row.steps_per_s:,.0f} steps/s, "
                                           f"{row.steps_per_joule or 0:.4g} steps/J")  # fmt: skip
                best = best_trial(study)
                progress.update(task, advance=1, best=f"{best.value:.4g}" if best else "-")
        except KeyboardInterrupt:
            interrupted = True
    best = best_trial(study)
    doc = {"study": study.study_name, "objective": args.objective, "trials": rows,
           "interrupted": interrupted,
           "best": None if best is None else {"number": best.number, "values": best.params,
                                              "objective": best.value,
                                              **best.user_attrs}}  # fmt: skip
    if interrupted:
        console.print("[red]interrupted[/red]: the study is consistent; rerun to go on")
    console.print("best: " + (f"trial {best.number} {best.params} -> {best.value:.4g}"
                              if best else "none"))  # fmt: skip
    write_json(args.json, doc)
    return 130 if interrupted else (0 if best is not None else 1)
