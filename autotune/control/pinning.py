"""A job pinned to its budget's cores: every thread of the job's process tree.

Linux keeps a CPU affinity mask per thread, and a new thread or process inherits its creator's.
So a job that takes a budget pins every thread of itself and of every process under it (actors,
stages, GMIs); those it starts later inherit the mask from the runner's threads.
"""

from __future__ import annotations

import logging
import os

logger = logging.getLogger(__name__)


def _threads(pid: int) -> list[int]:
    try:
        return [int(t) for t in os.listdir(f"/proc/{pid}/task")]
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return []


def pin_tree(root: int, cores: tuple[int, ...] | list[int]) -> int:
    """Pins every thread of ``root`` and of the processes under it to ``cores``; returns how
    many threads it pinned (a process that ended meanwhile is skipped).

    Raises:
        ValueError: ``cores`` is empty or names a core this process may not use.
    """
    import psutil

    allowed = set(range(os.cpu_count() or 1))
    if not cores or not set(cores) <= allowed:
        raise ValueError(
            f"cannot pin to cores {sorted(cores)}: this machine has cores 0..{max(allowed)}"
        )
    pids = [root]
    try:
        pids += [c.pid for c in psutil.Process(root).children(recursive=True)]
    except psutil.NoSuchProcess:
        return 0
    pinned, refused = 0, None
    for pid in pids:
        for tid in _threads(pid) or [pid]:
            try:
                os.sched_setaffinity(tid, cores)
                pinned += 1
            except ProcessLookupError:  # ended meanwhile
                continue
            except OSError as exc:  # cores outside this container's cpuset, say
                refused = exc
    if refused is not None and not pinned:
        raise ValueError(f"cannot pin to cores {sorted(cores)}: {refused}")
    return pinned
