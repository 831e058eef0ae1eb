"""Children started with Ctrl-C held back.

A terminal's Ctrl-C goes to the whole process group. The run's processes ignore it (the runner
drains them instead), but only once a child has started and imported its modules: one that is
starting when Ctrl-C comes would die of it, and the drain would then stop on a dead process.
So each child is started with SIGINT ignored, which it inherits through its exec (Python then
leaves it ignored, where it would install its KeyboardInterrupt handler), and blocked in the
runner meanwhile, which takes a Ctrl-C that came during the start as soon as the start is done.
(A blocked signal alone is not enough: a spawned child starts with no signal blocked.)

While SIGINT is ignored, a Ctrl-C that the kernel hands to another thread of the runner's process
(one that does not block SIGINT) is discarded, and the run would never drain. So the process's
other threads never take SIGINT: each is started with it blocked (``without_ctrl_c``: a thread
inherits its starter's mask), numpy's BLAS threads too (started at its import, by the
``runtime`` package's under ``ctrl_c_for_main_only``), and libzmq blocks every signal in its
own; a Ctrl-C during a start then stays pending until the main thread takes it. The hold also
launches multiprocessing's resource tracker before it blocks SIGINT: the tracker's first launch,
from inside a spawned child's start, unblocks SIGINT in the starting thread on its way out.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from multiprocessing import resource_tracker


@contextlib.contextmanager
def ctrl_c_held() -> Iterator[None]:
    """SIGINT ignored, for the children started in the body, and blocked in this (main) thread
    meanwhile; elsewhere, nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    # a spawned child's start launches multiprocessing's resource tracker the first time, and
    # that launch unblocks SIGINT in this thread on its way out: launched before the hold
    resource_tracker.ensure_running()
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    handler = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, handler)
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)


@contextlib.contextmanager
def ctrl_c_for_main_only() -> Iterator[None]:
    """SIGINT blocked in this thread for the body: the threads started in it, and the native
    threads a library starts as it loads (numpy's BLAS), inherit the mask and never take a
    Ctrl-C (see the module docstring)."""
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)


def without_ctrl_c(thread: threading.Thread) -> threading.Thread:
    """Starts ``thread`` with SIGINT blocked in it (``ctrl_c_for_main_only``); returns it."""
    with ctrl_c_for_main_only():
        thread.start()
    return thread
