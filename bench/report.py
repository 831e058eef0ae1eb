"""The one writer of result documents: every suite's results go through ``write_result``.

A result document is JSON: the suite's name, the machine it ran on, the command line, the date
and the results. ``write_json`` writes the per-arm files the reports read back (the same
machine description is in the suite's document).
"""

from __future__ import annotations

import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any


def machine_doc() -> dict[str, Any]:
    """The host, its cores, Python, the UTC date, torch's bytecode (``bench.bytecode``) and the
    GPUs NVML names (no CUDA context)."""
    doc: dict[str, Any] = {
        "host": platform.node(),
        "cores": os.cpu_count(),
        "python": platform.python_version(),
        "date_utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime()),
    }
    from bench.bytecode import STATE

    if STATE:  # what the suite found of torch's bytecode, and did (bench/bytecode.py)
        doc["bytecode"] = dict(STATE)
    try:
        from runtime.hw.gpus import list_gpus

        doc["gpus"] = [g.name for g in list_gpus()]
    except Exception as exc:  # an inventory failure must not stop a benchmark
        doc["gpus"] = f"unknown ({exc})"
    return doc


def ratio(a: float | None, b: float | None) -> float | None:
    """``a / b``, or None where either is missing or zero (a figure a run did not give)."""
    return a / b if a and b else None


def write_json(path: Path, doc: Any) -> Path:
    """Writes ``doc`` as indented JSON to ``path`` (its directory made)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=2) + "\n")
    return path


def write_result(
    out_dir: Path, suite: str, results: dict[str, Any], argv: list[str] | None = None
) -> Path:
    """Writes ``OUT/<suite>.json``: the suite, the machine, the command, the date, the results."""
    doc = {
        "suite": suite,
        "machine": machine_doc(),
        "command": ["python", "-m", "bench", *(sys.argv[1:] if argv is None else argv)],
        "date": time.strftime("%Y-%m-%d", time.gmtime()),
        "results": results,
    }
    return write_json(Path(out_dir) / f"{suite}.json", doc)
