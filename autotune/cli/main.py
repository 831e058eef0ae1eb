"""The ``autotune`` command line. The CLI owns the terminal; library code only logs."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

from autotune import __version__

logger = logging.getLogger("autotune")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="autotune",
        description="Tune CPU actors and GPU trainer slices of RL training for steps per joule.",
    )
    parser.add_argument("--version", action="version", version=f"autotune {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    from autotune.cli.train import add_train_command

    add_train_command(sub)

    gpu = sub.add_parser(
        "gpu",
        help="show the GPUs, their SMs, MIG and MPS state and energy-counter support",
        description="Read-only inventory: NVML for names, memory, power, MIG mode, compute mode "
        "and the energy counter; a short-lived CUDA process for SM counts; the MPS control "
        "daemon's state. Changes nothing on any GPU.",
    )
    gpu.add_argument(
        "--no-cuda",
        action="store_true",
        help="skip the SM query (it starts a short-lived CUDA process)",
    )
    gpu.add_argument(
        "--json", type=Path, default=None, metavar="PATH", help="write the inventory to PATH"
    )
    gpu.set_defaults(func=cmd_gpu)
    from autotune.cli.daemon import add_daemon_commands

    add_daemon_commands(sub)
    from autotune.cli.wrap import add_wrap_command

    add_wrap_command(sub)
    from autotune.cli.study import add_study_command

    add_study_command(sub)
    from autotune.cli.export import add_export_command

    add_export_command(sub)
    return parser


def write_json(path: Path | None, doc: object) -> None:
    """Writes ``doc`` as indented JSON to ``path`` (the ``--json`` flag of every command)."""
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(doc, indent=2, default=str) + "\n")


def cmd_gpu(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from runtime.hw.gpus import list_gpus, sm_counts
    from runtime.hw.mps import MPSControl

    console = Console()
    gpus = list_gpus()
    sms = sm_counts() if gpus and not args.no_cuda else []
    mps = MPSControl().state()
    doc = {
        "gpus": [
            {**g.to_dict(), "sm_count": sms[g.index] if g.index < len(sms) else None} for g in gpus
        ],
        "mps": {
            "binary": mps.binary,
            "running": mps.running,
            "pipe_dir": mps.pipe_dir,
            "servers": list(mps.servers),
            "mode": mps.mode,
        },
    }
    if not gpus:
        console.print(
            "no NVIDIA GPU visible through NVML: trainers run on the CPU, "
            "GPU energy is reported as 'none', and there is no MPS knob"
        )
    else:
        table = Table(title="GPUs (NVML indices)")
        for col in (
            "index",
            "name",
            "memory",
            "SMs",
            "power",
            "energy counter",
            "MIG",
            "compute mode",
        ):
            table.add_column(col)
        for g in doc["gpus"]:
            table.add_row(
                str(g["index"]),
                g["name"],
                f"{g['memory_total_mib']:,} MiB",
                str(g["sm_count"] or "-"),
                "-" if g["power_w"] is None else f"{g['power_w']:.0f} W",
                "yes" if g["energy_counter"] else "no (power polling)",
                g["mig_mode"],
                g["compute_mode"],
            )
        console.print(table)
    where = (
        f"running on {mps.pipe_dir} (servers {list(mps.servers)})"
        if mps.running
        else (
            "not running (autotune starts its own when GMIs need it)"
            if mps.binary
            else "not available: nvidia-cuda-mps-control is not on PATH"
        )
    )
    console.print(f"MPS control daemon: {where}")
    write_json(args.json, doc)
    if args.json is not None:
        console.print(f"wrote {args.json}")
    return 0


def parse_args(argv: list[str]) -> argparse.Namespace:
    """``argv`` parsed; for ``train``, ``explicit`` holds the flags given on the command line
    (they override a ``--config`` file: ``autotune.cli.train_config.train_config``)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "train":
        from autotune.cli.train_config import explicit_flags

        train = parser._subparsers._group_actions[0].choices["train"]
        args.explicit = explicit_flags(train, argv)
    return args


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    args = parse_args(sys.argv[1:] if argv is None else argv)
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
