"""Files written whole or not at all: the data goes to a temporary file beside the target, which
is renamed over it only once written (``os.replace`` is atomic within a directory). A full disk,
an error or a killed process leaves the file before it, never half of a new one."""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any


@contextlib.contextmanager
def replaced(
    path: str | os.PathLike[str], mode: str = "w", sync: bool = False, plain_mode: bool = False
) -> Iterator[IO[Any]]:
    """A file object open on a temporary file beside ``path`` (``mode``: ``"w"`` or ``"wb"``);
    when the block ends without an error the file is closed (and with ``sync`` flushed to disk)
    and renamed to ``path``; on an error it is removed and the error goes on.

    The temporary file is private to this process (``tempfile.mkstemp``: two writers never share
    one). ``plain_mode`` gives the file the permissions a plain ``open`` would (the umask's),
    not ``mkstemp``'s 0600.
    """
    target = Path(path)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    try:
        if plain_mode:
            umask = os.umask(0)
            os.umask(umask)
            os.fchmod(fd, 0o666 & ~umask)
        with os.fdopen(fd, mode) as f:
            yield f
            if sync:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
