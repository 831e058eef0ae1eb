"""``autotune study``: offline tuning, one fresh run per trial (see ``autotune.tuning.offline_study``)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any


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
        "knobs' values, and the first trial runs it as it is; --env and "
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
        help="wall seconds per trial run (default 30)",
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
        choices=["steps_per_joule", "steps_per_s", "both"],
        default="steps_per_joule",
        help="what to maximise; both: steps/s and steps/J, a multi-objective "
        "study with a Pareto front (default steps_per_joule)",
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


def study_name(args: argparse.Namespace) -> str:
    if args.study:
        return args.study
    from autotune.wrap.wrapper import script_name

    return f"study-{script_name(args.cmd)}" if args.cmd else f"study-{args.env}"


def check_args(args: argparse.Namespace) -> None:
    """Raises ValueError saying which settings are wrong and what is allowed."""
    args.cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    if args.trials < 1 or not args.trial_s > args.warmup_s >= 0:
        raise ValueError(
            f"--trials {args.trials}, --trial-s {args.trial_s}, --warmup-s "
            f"{args.warmup_s}: need trials >= 1, trial-s > warmup-s >= 0"
        )
    if args.reference_every < 0:
        raise ValueError(
            f"--reference-every {args.reference_every}: allowed 0 (never) or K "
            ">= 1 (a reference run after every K trials)"
        )
    if args.reference_every and args.workers > 1:
        raise ValueError(
            f"--reference-every with --workers {args.workers}: each worker runs on "
            "its own slice of the machine, which one reference cannot scale; run "
            "the study in one process (--workers 1)"
        )
    if not 0 <= args.confirm <= args.trials:
        raise ValueError(f"--confirm {args.confirm}: allowed 0..--trials ({args.trials})")
    if args.workers < 1 or args.workers > args.trials:
        raise ValueError(f"--workers {args.workers}: allowed 1..--trials ({args.trials})")
    if args.cmd and not args.knob:
        raise ValueError("-- CMD: give at least one --knob NAME=SPEC for the script")
    resolve_base(args)


def resolve_base(args: argparse.Namespace) -> None:
    """Sets ``args.env``, ``args.policy`` and ``args.base`` (the ``--from`` config as a dict,
    or None): the flags given win over the file's, the file's over the defaults.

    Raises:
        ValueError: a ``--from`` file that holds no valid config, or one given with -- CMD.
    """
    args.base = None
    if getattr(args, "from_config", None) is not None:
        if args.cmd:
            raise ValueError(
                "--from: a train config; a wrapped script (-- CMD) takes its settings from --knob"
            )
        from autotune.workflows.export import ExportError, load_config
        from runtime.config import ConfigError

        try:
            cfg = load_config(args.from_config, flag="--from")
        except ExportError as exc:
            raise ValueError(str(exc)) from None
        except ConfigError as exc:
            raise ValueError(f"--from {args.from_config}: {exc}") from None
        args.env = args.env or cfg.env
        args.policy = args.policy or cfg.policy
        args.seed = cfg.seed if args.seed is None else args.seed
        args.base = cfg.to_dict()
    args.env = args.env or "CartPole-v1"
    args.policy = args.policy or "auto"
    args.seed = 0 if args.seed is None else args.seed


def make_study(args: argparse.Namespace, cores: int | None = None, gpu: int | None = None) -> Any:
    """The ``OfflineStudy`` these arguments describe; a worker passes its core count and GPU.

    Raises:
        KnobError, StudyError, ValueError: bad knobs, storage or settings.
    """
    import os

    from autotune.tuning.knobs import KnobError, Machine, build_space
    from autotune.tuning.offline_study import OBJECTIVES, OfflineStudy, ScriptTrials, TrainTrials
    from autotune.tuning.storage import open_study

    meta: dict[str, Any] = {"objective": args.objective, "trial_s": args.trial_s}
    if args.cmd:
        from autotune.wrap.wrapper import Wrapper, parse_knob

        space = [parse_knob(k) for k in args.knob]
        if len({k.name for k in space}) != len(space):
            raise KnobError(f"a knob is given twice: {[k.name for k in space]}")
        trials: Any = ScriptTrials(Wrapper(args.cmd, args.trial_s, args.report_timeout_s), space)
        meta.update(kind="script", cmd=args.cmd)
    else:
        here = Machine.here()
        machine = Machine(cores or here.cores, here.gpus if gpu is None else 1)
        knobs = build_space(machine, args.knob)
        base = _base_config(args)
        _check_workload(base)
        meter = None
        if args.workers > 1:
            meter = _worker_meter(gpu)
        trials = TrainTrials(knobs, base, args.warmup_s, meter=meter)
        meta.update(
            kind="train",
            env=args.env,
            policy=args.policy,
            warmup_s=args.warmup_s,
            base=base.to_dict(),
            fixed=trials.fixed,
            machine={
                "cores": os.cpu_count(),
                "gpus": here.gpus,
                "worker_cores": machine.cores,
                "sm_count": _sm_count(here),
            },
        )
    study = open_study(
        args.storage, study_name(args), seed=args.seed, metrics=OBJECTIVES[args.objective]
    )
    offline = OfflineStudy(
        study,
        trials,
        args.objective,
        profile=not args.no_profile,
        reference_every=args.reference_every,
    )
    if "autotune" not in study.user_attrs:
        study.set_user_attr("autotune", {**meta, "default": trials.default()})
    elif "base" in meta:
        _check_same_base(study, meta["base"])
    return offline


def _check_same_base(study: Any, base: dict[str, Any]) -> None:
    """Raises ValueError if a resumed study's trials would start from another config than its
    first session's (``export`` builds its config from that one)."""
    import json

    stored = study.user_attrs["autotune"].get("base") or {}
    now = json.loads(json.dumps(base))  # tuples as the storage keeps them: lists
    differ = sorted(k for k in stored if k != "max_wall_s" and stored[k] != now.get(k))
    if differ:
        changes = ", ".join(f"{k}: {stored[k]!r} -> {now.get(k)!r}" for k in differ)
        raise ValueError(
            f"study {study.study_name!r} was started from another config ({changes}); "
            "its trials and export assume that one: give the same --from, --env, "
            "--policy and --seed, or a new --study"
        )


def _check_workload(base: Any) -> None:
    """Raises ValueError, before any trial, for an env or a policy spec that cannot run."""
    from runtime.config import ConfigError

    try:
        base.check_workload()
    except ConfigError as exc:
        raise ValueError(
            f"--env {base.env} --policy {base.policy}: {'; '.join(exc.problems)}"
        ) from None


def _base_config(args: argparse.Namespace) -> Any:
    """The config every trial starts from: the ``--from`` one (or the defaults) on this
    study's env, policy and seed, running for ``--trial-s`` with no checkpoint."""
    from runtime.config import TrainConfig

    doc = dict(args.base or {})
    doc.update(
        env=args.env,
        policy=args.policy,
        seed=args.seed,
        steps=10**12,
        max_wall_s=args.trial_s,
        checkpoint=None,
    )
    return TrainConfig.from_dict(doc)


def _sm_count(machine: Any) -> int | None:
    if not machine.gpus:
        return None
    import torch

    return int(torch.cuda.get_device_properties(0).multi_processor_count)


def _worker_meter(gpu: int | None) -> Any:
    """A local worker's meter: its own GPU and the CPU time of its own processes (RAPL and the
    machine-wide model would charge every worker for the others)."""
    import os

    from runtime.energy import EnergyMeter
    from runtime.energy.cpu import CPUModelEnergy, tree_pids
    from runtime.energy.gpu import NullGPUEnergy, probe_gpu_energy

    def meter() -> Any:
        gpu_source = NullGPUEnergy() if gpu is None else probe_gpu_energy((gpu,))
        return EnergyMeter(gpu=gpu_source, cpu=CPUModelEnergy(pids=lambda: tree_pids(os.getpid())))

    return meter


def cmd_study(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

    from autotune.cli.main import write_json
    from autotune.tuning.knobs import KnobError
    from autotune.tuning.storage import StudyError

    console = Console(stderr=True)
    try:
        check_args(args)
        plan = []
        if args.workers > 1:
            from autotune.workflows.study_workers import plan_workers

            plan = plan_workers(args)
        offline = make_study(args, cores=len(plan[0].cores) if plan else None)
    except (KnobError, StudyError, ValueError) as exc:
        console.print(f"[red]error:[/red] {exc}")
        return 2
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

        if args.workers > 1:
            from autotune.workflows.study_workers import run_workers

            interrupted = run_workers(args, plan, done, say=progress.console.print)
        else:
            interrupted = _run_here(offline, args.trials, args.confirm, done)
    closer = getattr(offline.trials, "wrapper", None)
    if closer is not None:
        closer.close()
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


def _run_here(offline: Any, trials: int, confirm: int, done: Any) -> bool:
    """Runs ``trials`` trials in this process, the last ``confirm`` of them confirmations;
    True if Ctrl-C cut them."""
    try:
        for i in range(trials):
            done(offline.step(confirm=i >= trials - confirm).__dict__)
    except KeyboardInterrupt:
        return True
    return False


def describe(row: dict[str, Any]) -> str:
    head = f"trial {row['number']} ({row['role']}) {row['values']}"
    if row.get("worker") is not None:
        head = f"[w{row['worker']}] {head}"
    if row["error"]:
        return f"{head}: [red]{row['error']}[/red]"
    text = f"{head}: {row['steps_per_s']:,.0f} steps/s, {row['steps_per_joule'] or 0:.4g} steps/J"
    scaled = row["attrs"].get("scaled_steps_per_joule")
    if scaled and row["steps_per_joule"] and abs(scaled / row["steps_per_joule"] - 1) > 1e-9:
        text += f" (scaled {scaled:.4g} by reference trial {row['attrs']['reference_trial']})"
    return text


def best_text(offline: Any) -> str:
    from autotune.tuning.storage import best_trial, pareto_front

    if len(offline.metrics) > 1:
        front = pareto_front(offline.study)
        return f"Pareto front: {len(front)} trials" if front else ""
    best = best_trial(offline.study)
    return f"best: trial {best.number} {best.params} -> {best.value:.4g}" if best else ""


def summary(study: Any, objective: str) -> dict[str, Any]:
    """The best trial (by steps/J for ``both``) and the Pareto front, for ``--json``."""
    from autotune.tuning.storage import best_trial, pareto_front

    def trial_doc(t: Any) -> dict[str, Any]:
        return {"number": t.number, "values": t.params, "objective": t.values, **t.user_attrs}

    best = best_trial(study, metric=1 if objective == "both" else 0)
    return {
        "best": None if best is None else trial_doc(best),
        "pareto_front": [trial_doc(t) for t in pareto_front(study)],
    }
