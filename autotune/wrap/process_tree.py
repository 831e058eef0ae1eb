"""A wrapped script's process tree: its descendants remembered as they are seen (``Tree``),
and ending it (``stop_tree``). A process the script started that outlives it (re-parented once
the script is gone: a data loader's worker, a simulator server) would go on drawing CPU, and
holding a GPU, through the next trial's measurement; the wrapper ends it with the script."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import time

import psutil

from runtime.energy.cpu import tree_pids

logger = logging.getLogger(__name__)

TERM_GRACE_S = 10.0
"""How long the script and its processes get between SIGTERM and SIGKILL."""
SEEN_MAX = 256
"""Descendants remembered before those that have exited are forgotten."""


class Tree:
    """The tree of ``proc``: ``pids`` (for the CPU model) remembers each descendant it sees, so
    that those still running once the script has exited can be ended (``end_outliving``)."""

    def __init__(self, proc: subprocess.Popen) -> None:
        self.proc = proc
        self.seen: dict[int, psutil.Process] = {}

    def pids(self) -> list[int]:
        """The script and its descendants alive now."""
        pids = tree_pids(self.proc.pid)
        for pid in pids[1:]:
            known = self.seen.get(pid)
            if known is None or not known.is_running():  # new, or its pid reused since
                with contextlib.suppress(psutil.Error):  # as psutil objects: a pid reused
                    self.seen[pid] = psutil.Process(pid)  # later is not taken for it
        if len(self.seen) > SEEN_MAX:  # a script that starts many short-lived processes
            self.seen = {pid: p for pid, p in self.seen.items() if _running(p)}
        return pids

    def end_outliving(self) -> int:
        """Ends (SIGTERM, then SIGKILL after ``TERM_GRACE_S``) every descendant seen that still
        runs after the script exited; returns how many there were."""
        left = [p for p in self.seen.values() if _running(p)]
        if left:
            logger.warning(
                "%d process(es) the script started outlived it (pids %s); ended",
                len(left),
                sorted(p.pid for p in left),
            )
            _end(left, time.monotonic() + TERM_GRACE_S)
        return len(left)


def _running(p: psutil.Process) -> bool:
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _end(procs: list[psutil.Process], deadline: float) -> None:
    for p in procs:
        with contextlib.suppress(psutil.Error):
            p.terminate()
    _, alive = psutil.wait_procs(procs, timeout=max(0.0, deadline - time.monotonic()))
    for p in alive:
        with contextlib.suppress(psutil.Error):
            p.kill()


def stop_tree(proc: subprocess.Popen, tree: Tree | None = None) -> None:
    """SIGTERM to the process tree, then SIGKILL after ``TERM_GRACE_S``: to the script, and
    to any process of its tree that outlived it (re-parented once the script died), those
    ``tree`` saw before as well."""
    deadline = time.monotonic() + TERM_GRACE_S
    pids = tree_pids(proc.pid)
    below = dict(tree.seen) if tree is not None else {}
    for pid in pids[1:]:
        if pid not in below:
            with contextlib.suppress(psutil.Error):
                below[pid] = psutil.Process(pid)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    for p in below.values():  # seen before, outside the tree now: re-parented already
        if p.pid not in pids:
            with contextlib.suppress(psutil.Error):
                p.terminate()
    try:
        proc.wait(timeout=TERM_GRACE_S)
    except subprocess.TimeoutExpired:
        for pid in tree_pids(proc.pid) or pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    _end([p for p in below.values() if _running(p)], deadline)
