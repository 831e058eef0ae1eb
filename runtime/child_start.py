"""Children started with Ctrl-C held back.

A terminal's Ctrl-C goes to the whole process group. The run's processes ignore it (the runner
drains them instead), but only once a child has started and imported its modules: one that is
starting when Ctrl-C comes would die of it, and the drain would then stop on a dead process.
So each child is started with SIGINT ignored, which it inherits through its exec (Python then
leaves it ignored, where it would install its KeyboardInterrupt handler), and blocked in the
runner meanwhile, which takes a Ctrl-C that came during the start as soon as the start is done.
(A blocked signal alone is not enough: a spawned child starts with no signal blocked.)
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator


@contextlib.contextmanager
def ctrl_c_held() -> Iterator[None]:
    """SIGINT ignored, for the children started in the body, and blocked in this (main) thread
    meanwhile; elsewhere, nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    handler = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, handler)
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
