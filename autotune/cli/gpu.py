"""``autotune gpu``: a read-only inventory of the GPUs, their SMs, MIG and MPS state."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from autotune.cli.output import write_json
from runtime.hw.gpus import list_gpus, sm_counts_of
from runtime.hw.mps import MPSControl


def add_gpu_command(sub: Any) -> None:
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


def cmd_gpu(args: argparse.Namespace) -> int:
    console = Console(emoji=False)
    gpus = list_gpus()
    sms = sm_counts_of(gpus) if gpus and not args.no_cuda else {}
    mps = MPSControl().state()
    doc = {
        "gpus": [{**g.to_dict(), "sm_count": sms.get(g.index)} for g in gpus],
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
