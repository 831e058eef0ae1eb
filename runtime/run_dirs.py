"""A run's private directory (its ipc sockets, rendezvous and hand-over files), and the sweep
that removes those a killed run left behind.

The directory is a ``tempfile.TemporaryDirectory`` (mode 0700) named ``autotune-*``, removed
when the run ends. A run whose main process is SIGKILLed cannot remove it, so every run
records its owner in ``owner.json`` (pid and process start time), and the next run of the same
user removes every such directory whose owner is gone. A directory with no readable owner file
(another program's, or one being created) is left alone.

The start time is compared in clock ticks since boot where ``/proc`` gives them: a wall-clock
start (boot time plus ticks) moves when the system clock is stepped, and a live run's directory
was once swept from under it because its owner's start time seemed to have changed.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import psutil

PREFIX = "autotune-"
OWNER = "owner.json"

logger = logging.getLogger(__name__)


def _boot_ticks(pid: int) -> int | None:
    """The process's start in clock ticks since boot (``/proc/PID/stat``'s 22nd field), which no
    clock change moves; None where there is no such file."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    try:  # the fields after the command name, which may hold spaces and parentheses
        return int(stat[stat.rindex(")") + 2 :].split()[19])
    except (ValueError, IndexError):
        return None


def _owner_alive(doc: dict) -> bool:
    try:
        pid = int(doc["pid"])
        proc = psutil.Process(pid)
        ticks = doc.get("boot_ticks")
        if isinstance(ticks, int) and (now := _boot_ticks(pid)) is not None:
            return now == ticks
        return abs(proc.create_time() - float(doc["started"])) < 1.0
    except (psutil.NoSuchProcess, psutil.AccessDenied, KeyError, TypeError, ValueError):
        return False


def sweep(root: str | None = None) -> list[str]:
    """Removes this user's run directories under ``root`` (the temp dir) whose owner is gone;
    returns their paths."""
    removed = []
    for path in Path(root or tempfile.gettempdir()).glob(PREFIX + "*"):
        try:
            if not path.is_dir() or path.stat().st_uid != os.getuid():
                continue
            doc = json.loads((path / OWNER).read_text())
        except (OSError, ValueError):
            continue
        if not isinstance(doc, dict) or _owner_alive(doc):
            continue
        shutil.rmtree(path, ignore_errors=True)
        removed.append(str(path))
        logger.info("removed %s, left by a run that was killed (pid %s)", path, doc.get("pid"))
    return removed


@contextlib.contextmanager
def run_dir() -> Iterator[str]:
    """A new private run directory, removed on exit; stale ones are swept first."""
    sweep()
    with tempfile.TemporaryDirectory(prefix=PREFIX) as path:
        doc = {"pid": os.getpid(), "started": psutil.Process().create_time()}
        if (ticks := _boot_ticks(os.getpid())) is not None:
            doc["boot_ticks"] = ticks
        Path(path, OWNER).write_text(json.dumps(doc))
        yield path
