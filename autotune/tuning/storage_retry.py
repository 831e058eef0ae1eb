"""Opening a study storage that another process is setting up at the same moment.

Optuna creates a storage's tables the first time a process opens it (``RDBStorage``): a study
just started and ``autotune status`` reading it, or two study workers starting together, can
create them at once, and SQLite then says a table already exists or the database is locked.
Such a failure is tried again a few times, waiting a little longer each time, before it
counts; any other failure counts at once.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

TRANSIENT = ("database is locked", "already exists")
"""What SQLite says when another process creates the same tables at the same time."""
TRIES = 5
FIRST_WAIT_S = 0.1


def opened(open_it: Callable[[], T]) -> T:
    """``open_it()``, tried again where it fails with a ``TRANSIENT`` error (``TRIES`` in all,
    waiting ``FIRST_WAIT_S`` and doubling); its last error otherwise."""
    wait = FIRST_WAIT_S
    for _ in range(TRIES - 1):
        try:
            return open_it()
        except Exception as exc:
            if not any(t in str(exc) for t in TRANSIENT):
                raise
        time.sleep(wait)
        wait *= 2
    return open_it()
