"""``autotune wrap [--knob NAME=RANGE ...] -- CMD ...`` (see ``autotune.wrap.wrapper``)."""

from __future__ import annotations

import argparse
import math
import signal
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape

from autotune.cli.output import check_output, check_output_dir, write_json, write_text
from autotune.tuning.knobs import KnobError

RETRIES = 1
"""A config whose run failed is run once more (in the next trial) before it is marked
unrunnable: the cause may have been a busy machine or too short a ``--trial-s``."""


def add_wrap_command(sub: Any) -> None:
    wrap = sub.add_parser(
        "wrap",
        help="tune any training script: each trial is a fresh run of CMD with new knobs",
        description="Runs CMD once per trial with the knobs in AUTOTUNE_KNOBS (JSON), "
        "AUTOTUNE_<NAME> and {name} placeholders in its arguments, measures the steps it "
        "reports through autotune.client (or each run, if it reports none), its wall time and "
        "the energy of its process tree, and keeps every trial in an Optuna study. The "
        "script's own output passes through untouched.",
        epilog="example: autotune wrap --knob num_envs=1..16 --knob batch_size=64,128,256 "
        "--trials 20 -- python examples/ppo_gymnasium.py --num-envs {num_envs}",
    )
    wrap.add_argument(
        "--knob",
        action="append",
        default=[],
        metavar="NAME=SPEC",
        help="a knob: NAME=LOW..HIGH (integers), NAME=A,B,C or NAME=VALUE "
        "(repeatable; at least one)",
    )
    wrap.add_argument(
        "--objective",
        choices=["steps_per_joule", "steps_per_s"],
        default="steps_per_joule",
        help="what to maximise (default steps_per_joule)",
    )
    wrap.add_argument(
        "--mode",
        choices=["restart", "live"],
        default="restart",
        help="restart: a fresh run of CMD per trial (default); live: one run "
        "that takes new knobs at autotune.client.poll()",
    )
    wrap.add_argument(
        "--trials",
        type=int,
        default=20,
        help="trials: runs of CMD, or live configs before holding the best (default 20)",
    )
    wrap.add_argument(
        "--window-s",
        type=float,
        default=10.0,
        help="live: measurement window per config (default 10)",
    )
    wrap.add_argument(
        "--warmup-s",
        type=float,
        default=2.0,
        help="live: warm-up after the script took a config (default 2)",
    )
    wrap.add_argument(
        "--trial-s",
        type=float,
        default=None,
        help="restart mode: stop a run after this many seconds and measure it up to there "
        "(default: let it finish; live mode runs the script once, to its end)",
    )
    wrap.add_argument(
        "--report-timeout-s",
        type=float,
        default=60.0,
        help="a run that reported once and then stays silent this long is hung (default 60; "
        "live mode: from its last poll, after a first message its start-up gets 300 s for)",
    )
    wrap.add_argument(
        "--storage",
        default="sqlite:///autotune.db",
        help="Optuna RDB storage URL (default sqlite:///autotune.db)",
    )
    wrap.add_argument("--study", default=None, help="study name (default wrap-<script name>)")
    wrap.add_argument("--seed", type=int, default=0, help="sampler seed (default 0)")
    wrap.add_argument(
        "--default",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="the script's own value of a knob (repeatable): trial one runs the script's "
        "defaults (a knob without one: the value its --NAME flag has in CMD without a "
        "placeholder, else its first value)",
    )
    wrap.add_argument(
        "--resume",
        action="store_true",
        help="go on with a study made for another command or other knobs (refused otherwise)",
    )
    wrap.add_argument(
        "--json",
        type=Path,
        default=None,
        metavar="PATH",
        help="write the trials and the best config to PATH",
    )
    wrap.add_argument(
        "--export",
        type=Path,
        default=None,
        metavar="PATH",
        help="when the wrap ends, write the study's recommendation to PATH (JSON, or YAML for "
        ".yaml/.yml): the best knob values, the command with them filled in, and the evidence "
        "(as autotune export --study NAME does)",
    )
    wrap.add_argument(
        "--plots", type=Path, default=None, metavar="DIR", help="with --export: PNG plots into DIR"
    )
    wrap.add_argument("cmd", nargs=argparse.REMAINDER, help="-- CMD ARGS...")
    wrap.set_defaults(func=cmd_wrap)


def cmd_wrap(args: argparse.Namespace) -> int:
    # optuna, through the tuning layer: imported by this command only
    from autotune.tuning.storage import StudyError, open_study
    from autotune.wrap.study_check import check_wrap_study
    from autotune.wrap.wrapper import Wrapper, parse_knob, script_defaults, script_name

    console = Console(stderr=True, emoji=False)
    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    wrapper = None
    try:  # every check before the study is touched: a refused run leaves it as it was
        if not args.knob:
            raise KnobError("give at least one --knob NAME=SPEC to tune")
        if args.trials < 1:
            raise KnobError(f"--trials {args.trials}: must be >= 1")
        if args.mode == "live" and args.trial_s is not None:
            raise KnobError("--trial-s stops restart mode's runs; live mode runs the script once")
        timeouts = {"--trial-s": args.trial_s, "--report-timeout-s": args.report_timeout_s}
        for flag, value in timeouts.items():
            if value is not None and not 0 < value < math.inf:
                raise KnobError(f"{flag} {value}: allowed a number of seconds > 0")
        if args.plots is not None and args.export is None:
            raise KnobError("--plots DIR draws the recommendation --export PATH writes: give both")
        if args.mode == "live":
            _live_settings(args)  # raises ValueError for a window or warm-up out of range
        space = [parse_knob(k, "live" if args.mode == "live" else "restart") for k in args.knob]
        names = [k.name for k in space]
        if len({n.upper() for n in names}) != len(names):  # AUTOTUNE_<NAME> tells them apart
            raise KnobError(f"a knob is given twice (names differ in case at most): {names}")
        check_output(args.export, "--export", args.storage)
        check_output_dir(args.plots, "--plots")  # --json: checked for every command
        args.defaults = script_defaults(args.default, space, cmd)
        wrapper = Wrapper(cmd, args.trial_s, args.report_timeout_s)
        name = args.study or f"wrap-{script_name(cmd)}"
        study = open_study(args.storage, name, seed=args.seed)
        made = {
            "mode": args.mode,
            "cmd": cmd,
            "knobs": list(args.knob),
            "objective": args.objective,
        }
        check_wrap_study(study, made, space, args.resume)
        study.set_user_attr("wrap", {**made, "trial_s": args.trial_s})
        study.set_user_attr("wrap_defaults", args.defaults)
        if args.mode != "live" and not study.trials:  # trial one: the script's own defaults
            tuned = [k.name for k in space if len(k.choices) > 1]
            study.enqueue_trial({name: args.defaults[name] for name in tuned})
    except (KnobError, StudyError, ValueError) as exc:
        if wrapper is not None:
            wrapper.close()
        console.print(f"[red]error:[/red] {escape(str(exc))}")
        return 2
    previous = signal.signal(signal.SIGTERM, _interrupt)  # stopped: as Ctrl-C, the script too
    try:
        if args.mode == "live":
            return _wrap_live(args, console, cmd, space, study, wrapper)
        return _wrap_restart(args, console, cmd, space, study, wrapper)
    finally:
        signal.signal(signal.SIGTERM, previous)


def _live_settings(args: argparse.Namespace) -> Any:
    """Live mode's tuner settings. Raises ValueError for one out of range (saying which)."""
    from autotune.tuning.settings import TunerSettings

    settings = TunerSettings(
        objective=args.objective,
        warmup_s=args.warmup_s,
        window_s=args.window_s,
        window_max_s=args.window_s,  # a script's steps come as it reports them: fixed windows
        trials=args.trials,
        sampler="tpe",  # the throughput model describes the runtime, not a script
    )
    if problems := settings.problems():
        raise ValueError("invalid tuner settings: " + "; ".join(problems))
    return settings


def _interrupt(signum: int, _frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def _wrap_restart(
    args: argparse.Namespace,
    console: Any,
    cmd: list[str],
    space: list[Any],
    study: Any,
    wrapper: Any,
) -> int:
    # optuna, through the tuning layer: imported by this command only
    from autotune.tuning.storage import (
        ask,
        config_errors,
        fail_config,
        fail_interrupted,
        fail_orphans,
        failed_configs,
        skip_if_failed,
        trial_values,
    )
    from autotune.tuning.study_best import best_trial, command_run
    from autotune.wrap.progress import WrapProgress, clear_live

    fail_orphans(study)
    failed = failed_configs(study, RETRIES)
    progress = WrapProgress(console, study)
    wrapper.on_report = progress.update
    rows: list[dict[str, Any]] = []
    interrupted = False
    try:
        for i in range(args.trials):
            trial = ask(study)
            values = {
                k.name: k.choices[0]
                if len(k.choices) == 1
                else trial.suggest_categorical(k.name, list(k.choices))
                for k in space
            }
            if skip_if_failed(study, trial, values, failed):
                continue
            console.print(f"[bold]trial {trial.number}[/bold]: {values}")
            progress.start(trial.number)
            try:
                run = wrapper.run_trial(trial.number, values)
            except KeyboardInterrupt:
                fail_interrupted(study, trial, "Ctrl-C")
                raise
            for name, value in {**run.attrs(cmd), "values": values}.items():
                trial.set_user_attr(name, value)
            row = {"number": trial.number, **run.__dict__, "unit": run.unit}
            if run.error is not None:
                again = fail_config(study, trial, values, run.error, failed, RETRIES)
                if again and i + 1 < args.trials:  # a busy machine, a short --trial-s: next
                    study.enqueue_trial({k: v for k, v in values.items() if k in trial.params})
                console.print(
                    f"  [red]failed:[/red] {escape(str(run.error))} (the best so far is kept; "
                    + ("it is tried once more)" if again else "not tried again)")
                )
            else:
                row["objective"] = score = run.score(args.objective)
                for name, value in run.figures().items():
                    trial.set_user_attr(name, value)
                study.tell(trial, score)
                console.print(f"  {measured_line(run, args.objective)}", highlight=False)
            rows.append(row)
    except KeyboardInterrupt:
        console.print("[red]interrupted[/red]: the study is consistent; rerun to go on")
        interrupted = True
    finally:
        wrapper.close()
        clear_live(study)
    best = best_trial(study, run_of=command_run)  # one command's runs of a config, never pooled
    doc = {
        "study": study.study_name,
        "objective": args.objective,
        "cmd": cmd,
        "trials": rows,
        "best": None
        if best is None
        else {"number": best.number, "values": trial_values(best), "objective": best.value},
    }
    if best is None:
        console.print("[red]no trial completed[/red]")
        for key, errors in config_errors(study).items():
            console.print(f"  {escape(key)} failed {len(errors)}x: {escape(errors[-1])}")
    else:
        console.print(f"best: trial {best.number} {doc['best']['values']} -> {best.value:.4g}")
    write_json(args.json, doc)
    export_at_end(args, console, study)
    return 130 if interrupted else 0 if best is not None else 1  # 130: as a shell says SIGINT


def _wrap_live(
    args: argparse.Namespace,
    console: Any,
    cmd: list[str],
    space: list[Any],
    study: Any,
    wrapper: Any,
) -> int:
    # optuna, through the tuning layer: imported by this command only
    from autotune.tuning.job import Job
    from autotune.tuning.online_tuner import OnlineTuner
    from autotune.tuning.runner_job import tuning_doc
    from autotune.wrap.live import LiveModeUnsupported, run_live
    from autotune.wrap.progress import WrapProgress, clear_live

    knobs = {k.name: k for k in space}
    base = dict(args.defaults)  # the script's own values: where the live tuner starts
    try:
        settings = _live_settings(args)

        def factory(job: Job) -> OnlineTuner:
            return OnlineTuner(study, knobs, job, settings, base)

        progress = WrapProgress(console, study)
        progress.start("live")
        tuner, code = run_live(wrapper, factory, base, args.report_timeout_s, progress.update)
    except (ValueError, LiveModeUnsupported) as exc:  # bad settings, or a script never polling
        console.print(f"[red]error:[/red] {escape(str(exc))}")
        return 2
    except KeyboardInterrupt:
        console.print("[red]interrupted[/red]: the study is consistent; rerun to go on")
        return 130
    finally:
        wrapper.close()
        clear_live(study)
    doc = {"cmd": cmd, "mode": "live", "returncode": code, **tuning_doc(tuner, knobs)}
    best = doc["best"]
    said = f"{best['values']} -> {best['objective']:.4g}" if best else "none"
    console.print(
        f"script exited with code {code}; {tuner.trials_done} configs tried; best: {said}"
    )
    write_json(args.json, doc)
    export_at_end(args, console, study)
    return code if code else 0 if best is not None else 1  # the script's failure is the run's


def export_at_end(args: argparse.Namespace, console: Any, study: Any) -> None:
    """``--export PATH`` (and ``--plots DIR``): the study's recommendation, once it has a
    completed trial."""
    if args.export is None:
        return
    from autotune.workflows.export import ExportError, dump
    from autotune.workflows.wrap_export import wrap_export_doc, write_wrap_plots

    try:
        doc = wrap_export_doc(study)
    except ExportError as exc:
        console.print(f"[yellow]not exported:[/yellow] {escape(str(exc))}")
        return
    fmt = "yaml" if args.export.suffix in (".yaml", ".yml") else "json"
    try:
        write_text(args.export, dump(doc, fmt))  # whole or not at all
        console.print(f"exported {args.export}: {' '.join(doc['recommended']['command'])}")
    except OSError as exc:  # the study keeps every trial: autotune export can write it later
        console.print(
            f"[red]not exported:[/red] {escape(str(exc))}; the study is intact: "
            f"autotune export --study {escape(study.study_name)} --out PATH"
        )
        return
    if args.plots is not None:
        try:
            paths = write_wrap_plots(study, args.plots, doc["recommended"]["values"])
            console.print("plots: " + ", ".join(str(p) for p in paths))
        except OSError as exc:
            console.print(f"[red]plots not drawn:[/red] {escape(str(exc))} (the export is)")


def measured_line(run: Any, objective: str) -> str:
    """A trial's figure, what it was measured over, and its whole run."""
    per = "J" if "joule" in objective else "s"
    head = f"{run.score(objective):.4g} {run.unit}/{per}"
    whole = (
        f"{run.steps or 1:,} {run.unit} in {run.wall_s:.1f} s, "
        f"GPU {run.gpu_j:.0f} J + CPU {run.cpu_j:.0f} J model"
    )
    w = run.window
    if not w or w["gpu_j"] + w["cpu_j"] <= 0:
        return f"{head} (the whole run: {whole})"
    return (
        f"{head} over {w['s']:.1f} s from its {w['from']} ({w['amount']:,.0f} {run.unit}, "
        f"{w['gpu_j'] + w['cpu_j']:.0f} J); whole run: {whole}"
    )
