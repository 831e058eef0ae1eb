"""What the daemon accepts from its control socket beyond the message format: a file path
that comes in a message is checked before anything opens it (a forged registration must not
make the daemon create or write a file of the sender's choosing)."""

from __future__ import annotations

import os
import stat
from typing import Any

from autotune.control.home import state_dir
from autotune.tuning.storage import sqlite_file


def storage_problem(url: Any) -> str | None:
    """Why the daemon will not open the storage a HELLO names, or None. A file path that comes
    in over the socket may name a file the daemon would create: only under the daemon's state
    dir may it be new. Elsewhere it must already exist (the job creates its study before it
    registers) as a regular file of the daemon's user, not a link."""
    if not isinstance(url, str):
        return f"the storage must be a URL string, got {type(url).__name__}"
    path = sqlite_file(url)
    if path is None:
        return None  # a database server: nothing is created on this host
    home = os.path.realpath(state_dir())
    if os.path.commonpath([home, os.path.realpath(path)]) == home:
        return None
    try:
        info = path.lstat()
    except OSError:
        return (
            f"the SQLite file {path} does not exist; the daemon creates storage files only "
            f"under its state dir {home} (a job creates its own study before it registers)"
        )
    if not stat.S_ISREG(info.st_mode) or info.st_uid != os.getuid():
        return (
            f"{path} is not a regular file of this user (links and other users' files are "
            "not opened from a message)"
        )
    return None
