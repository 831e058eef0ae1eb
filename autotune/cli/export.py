"""``autotune export --study NAME``: the recommended config and hardware sizing of a study."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape

from autotune.cli.output import OutputPathError, check_output, check_output_dir, write_text
from runtime.config import ConfigError


def add_export_command(sub: Any) -> None:
    export = sub.add_parser(
        "export",
        help="write a study's recommended runtime config and hardware sizing (JSON or YAML), "
        "with its evidence and plots",
        description="Reads an 'autotune study --env', 'autotune study -- CMD' or 'autotune "
        "wrap' study. For a wrapped script's study it writes the script's best knob values, "
        "the command with them filled in and the evidence. For a training study it writes "
        "the config with the best median of what --pick names, the study's own objective by "
        "default (actors, envs per actor, GMIs per GPU, MPS % per GMI, batch sizes, trainer "
        "device, and a full config for 'autotune train --config'), the CPU threads per GPU "
        "SM it needs (null for a CPU trainer), what a target machine would need, and the "
        "evidence: trials, and its measured steps/J against the default config's.",
        epilog="example: autotune export --study ant-study --format yaml --out ant.yaml "
        "--plots plots/ --target-gpus 8 --target-cores 96",
    )
    export.add_argument("--study", required=True, help="study name")
    export.add_argument(
        "--storage",
        default="sqlite:///autotune.db",
        help="Optuna RDB storage URL (default sqlite:///autotune.db)",
    )
    export.add_argument(
        "--format",
        choices=["json", "yaml"],
        default=None,
        help="output format (default: from --out's suffix, else json)",
    )
    export.add_argument(
        "--out", type=Path, default=None, help="write to this file (default: standard output)"
    )
    export.add_argument(
        "--plots", type=Path, default=None, metavar="DIR", help="also write PNG plots into DIR"
    )
    export.add_argument(
        "--pick",
        choices=["steps_per_joule", "steps_per_s", "goodput_per_joule", "target_per_mj"],
        default=None,
        help="what the recommendation maximises (default: the study's "
        "objective; steps/J for a multi-objective study; target_per_mj, "
        "1e6 / joules to the target return, for a joules_to_target study)",
    )
    export.add_argument(
        "--target-gpus", type=int, default=None, help="size a machine with this many GPUs"
    )
    export.add_argument(
        "--target-cores", type=int, default=None, help="size a machine with this many CPU cores"
    )
    export.add_argument(
        "--sms", type=int, default=None, help="SMs per GPU where the study did not record them"
    )
    export.set_defaults(func=cmd_export)


def cmd_export(args: argparse.Namespace) -> int:
    # optuna, through the tuning layer: imported by this command only
    from autotune.tuning.storage import StudyError, load_study
    from autotune.workflows.export import ExportError, dump, export_doc
    from autotune.workflows.wrap_export import is_wrap_study, wrap_export_doc, write_wrap_plots

    console = Console(stderr=True, emoji=False)
    fmt = args.format or ("yaml" if args.out and args.out.suffix in (".yaml", ".yml") else "json")
    try:
        for name in ("target_gpus", "target_cores", "sms"):
            value = getattr(args, name)
            if value is not None and value < 1:
                raise ExportError(f"--{name.replace('_', '-')} {value}: must be >= 1")
        check_output(args.out, "--out", args.storage)
        check_output_dir(args.plots, "--plots")
        study = load_study(args.storage, args.study)
        wrapped = is_wrap_study(study)
        if wrapped:
            given = [n for n in ("target_gpus", "target_cores", "sms") if getattr(args, n)]
            if given:
                flags = ", ".join("--" + n.replace("_", "-") for n in given)
                raise ExportError(
                    f"{flags}: a hardware sizing needs a study of autotune's own runtime "
                    "('autotune study --env'); a wrapped script's study holds its knobs"
                )
            doc = wrap_export_doc(study, args.pick)
        else:
            doc = export_doc(study, args.pick, args.target_gpus, args.target_cores, args.sms)
    except (ExportError, StudyError, ConfigError, OutputPathError) as exc:
        console.print(f"[red]error:[/red] {escape(str(exc))}")
        return 2
    text = dump(doc, fmt)
    if args.out is None:
        sys.stdout.write(text)
    else:
        try:
            write_text(args.out, text)
        except OSError as exc:
            console.print(f"[red]error:[/red] cannot write {args.out}: {escape(str(exc))}")
            return 1
        console.print(f"wrote {args.out}")
    if args.plots is not None:
        from autotune.workflows.plots import write_plots

        values = doc["recommended"]["values"]
        # the SM plot shows the study's GPU trials, whatever device the recommendation uses
        sms = None if wrapped else args.sms or (doc["evidence"]["machine"] or {}).get("sm_count")
        try:
            paths = (
                write_wrap_plots(study, args.plots, values)
                if wrapped
                else write_plots(study, args.plots, sms, values)
            )
        except OSError as exc:
            console.print(
                f"[red]error:[/red] cannot write plots in {args.plots}: {escape(str(exc))}"
            )
            return 1
        console.print("plots: " + ", ".join(str(p) for p in paths))
    ev, metric = doc["evidence"], doc["picked_by"]
    if metric == "target_per_mj":
        console.print(target_line(doc))
        return 0
    rec, ratio = ev["recommended"][metric]["median"], ev[f"{metric}_vs_default"]
    scaled = ev["recommended"].get(f"scaled_{metric}", {}).get("median")
    refs = ev.get("reference_runs")
    unit = metric.replace("_per_", "/")
    if wrapped:
        unit = unit.replace("steps", doc["unit"])
        console.print("command: " + " ".join(doc["recommended"]["command"]))
    console.print(
        f"recommended: {doc['recommended']['values']} -> {rec:.4g} {unit} (median of "
        f"{len(ev['recommended']['trials'])} trial(s))"
        + (f", {scaled:.4g} scaled" if refs and refs["count"] > 1 and scaled else "")
        + (f", {ratio:.2f}x the default" if ratio else ", default not measured")
    )
    if ev.get("confirm"):
        console.print(f"[yellow]note:[/yellow] {ev['confirm']}")
    if refs and refs["count"] > 1:
        console.print(
            f"reference runs: {refs['count']}, the default's raw {unit} "
            f"{refs['min']:.4g}..{refs['max']:.4g}"
            + (f" ({refs['spread']:.2f}x)" if refs["spread"] else "")
        )
    return 0


def target_line(doc: dict[str, Any]) -> str:
    """A study to a target return's recommendation: the joules it took, against the default's."""
    ev = doc["evidence"]
    rec, ratio = ev["recommended"], ev.get(f"{doc['picked_by']}_vs_default")
    joules = rec["joules_to_target"]["median"]
    head = f"recommended: {doc['recommended']['values']} -> "
    if joules is None:
        return (
            head
            + f"no trial reached return {rec['target_return']:g} (best {rec['best_return']['max']})"
        )
    return (
        head + f"{joules:,.0f} J to return {rec['target_return']:g} (median of "
        f"{len(rec['trials'])} trial(s), {rec['reached']} reached it)"
        + (f", {ratio:.2f}x fewer joules than the default" if ratio else ", default not measured")
    )
