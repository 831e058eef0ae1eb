"""What every command writes besides the terminal: its ``--json`` document; what ``train``
adds to its result, and says of a run that trained nothing."""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import stat
import tempfile
from pathlib import Path
from typing import Any

from runtime.atomic_file import replaced


class OutputPathError(ValueError):
    """An output path that cannot be written: the message names the flag and why."""


def check_output(path: Path | None, flag: str, storage: str | None = None) -> None:
    """Refuses an output path before a command's work starts, rather than losing that work at
    the end: a directory where a file goes, a folder on the way that is a file, or the file
    (or a companion file) of the command's SQLite ``storage``, which holds every study in it.

    Raises:
        OutputPathError: naming ``flag``, the path and what is wrong with it.
    """
    if path is None:
        return
    db = _sqlite_file(storage)
    if db is not None:
        kept = (db, *(Path(f"{db}{s}") for s in STORAGE_COMPANIONS))
        if any(path.resolve() == p.resolve() for p in kept):
            raise OutputPathError(
                f"{flag} {path}: is a file of the study storage {db} (writing there would "
                "replace every study in it); give another path"
            )
    if path.is_dir():
        raise OutputPathError(f"{flag} {path}: is a directory; give a file path")
    for parent in path.parents:
        if parent.exists():
            if not parent.is_dir():
                raise OutputPathError(f"{flag} {path}: {parent} is a file, not a directory")
            if not os.access(parent, os.W_OK | os.X_OK):
                raise OutputPathError(f"{flag} {path}: {parent} is not writable")
            try:  # what access() lets by (root on /proc, a read-only mount): a file made there
                tempfile.TemporaryFile(dir=parent).close()
            except OSError as exc:
                raise OutputPathError(
                    f"{flag} {path}: cannot write in {parent} ({exc.strerror})"
                ) from None
            return


STORAGE_COMPANIONS = ("-wal", "-shm", "-journal", ".ask-lock")
"""Files SQLite (and the study's ``ask`` lock) keep beside a storage file."""
_SQLITE_URL = re.compile(r"sqlite(?:\+[\w.]+)?:///([^?]+)(?:\?.*)?")


def _sqlite_file(storage: object) -> Path | None:
    """The file of a SQLite storage URL (``sqlite:///`` of any driver; relative to here), read
    without importing the database layer (every command checks its outputs at its start)."""
    found = _SQLITE_URL.fullmatch(storage) if isinstance(storage, str) else None
    name = found.group(1) if found else ":memory:"
    return None if name == ":memory:" else Path(name).absolute()


def check_output_dir(path: Path | None, flag: str) -> None:
    """``check_output`` for a folder a command writes files into (made where missing).

    Raises:
        OutputPathError: naming ``flag``, the path and what is wrong with it.
    """
    if path is None:
        return
    if path.exists() and not path.is_dir():
        raise OutputPathError(f"{flag} {path}: is a file; give a directory")
    if not path.exists():
        check_output(path, flag)  # the folders on the way
    elif not os.access(path, os.W_OK | os.X_OK):
        raise OutputPathError(f"{flag} {path}: is not writable")


def write_text(path: Path, text: str) -> None:
    """Writes ``text`` to ``path`` whole or not at all (a temporary file beside it, then a
    rename): a full disk or a killed process never leaves half a file over a good one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with replaced(path, plain_mode=True) as f:  # as a plain write would make it, not 0600
        f.write(text)


def json_safe(doc: Any) -> Any:
    """``doc`` with what JSON cannot hold made so: map keys as text, NaN and infinities as
    None (for documents made of what others sent, such as a daemon's status)."""
    if isinstance(doc, dict):
        return {k if isinstance(k, str) else str(k): json_safe(v) for k, v in doc.items()}
    if isinstance(doc, list | tuple):
        return [json_safe(v) for v in doc]
    if isinstance(doc, float) and not math.isfinite(doc):
        return None
    return doc


def write_json(path: Path | None, doc: object) -> None:
    """Writes ``doc`` as indented JSON to ``path`` (the ``--json`` flag of every command), whole
    or not at all.

    Raises:
        OutputPathError: it could not be written (saying why).
    """
    if path is None:
        return
    text = json.dumps(doc, indent=2, default=str) + "\n"
    try:
        write_text(path, text)
    except OSError as exc:  # a disk that filled, a folder removed since the check at the start
        kept = keep_elsewhere(path, text)
        raise OutputPathError(f"--json {path}: cannot write it ({exc.strerror}); {kept}") from None


UNSAVED_DIR = "autotune-unsaved"
"""Where a ``--json`` document that could not be written is kept instead: this folder in the
system's temporary directory (often another file system), the user's own with mode 0700, or a
new one where a folder of that name is not (another user's, a link)."""


def _own_folder() -> Path:
    """``UNSAVED_DIR`` (made if need be), or a new private folder where it is not the user's."""
    folder = Path(tempfile.gettempdir()) / f"{UNSAVED_DIR}-{os.getuid()}"
    with contextlib.suppress(FileExistsError):
        folder.mkdir(mode=0o700)
    st = folder.lstat()
    if stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid() and not st.st_mode & 0o077:
        return folder
    return Path(tempfile.mkdtemp(prefix=f"{UNSAVED_DIR}-"))


def keep_elsewhere(path: Path, text: str) -> str:
    """Keeps a document that could not be written to ``path`` in the user's ``UNSAVED_DIR``, so
    the work it records is not lost; returns what was done, for the error message. It is not
    printed where that fails too (a wrapped script's command may hold a secret)."""
    try:
        fd, name = tempfile.mkstemp(dir=_own_folder(), prefix=f"{path.stem}-", suffix=".json")
        with os.fdopen(fd, "w") as f:
            f.write(text)
        return f"the document was kept at {name} instead"
    except OSError as exc:
        return f"nor could it be kept in a temporary folder ({exc.strerror}): it is lost"


def complete_result(result: dict, sizing: Any, where: str | None, tuning: dict | None) -> None:
    """Adds ``train``'s own parts to a run's result: the ``auto`` sizing, and the tuning's
    document (``where`` it ran; None: not tuned), or a note where the daemon gave none."""
    if sizing is not None:
        result["sizing"] = sizing
    if where is not None:
        result["tuning"] = tuning or {
            "note": "the daemon did not answer at the end; see autotune status --study"
        }
        result["tuning"]["where"] = where


def untrained_note(result: dict, max_wall_s: float | None) -> str | None:
    """What to tell the user of a run that ended before its first trained batch, with where its
    start-up went (None: it trained, or it failed and says why itself)."""
    if result.get("env_steps") or result.get("failure"):
        return None
    probes = (result.get("sizing") or {}).get("probes") or {}
    spent, probed = [], bool(probes) and not probes.get("cached")
    if probed:
        spent.append(f"the workload's probes took {float(probes.get('probe_s', 0.0)):.0f} s")
    starts = [g["startup"].get("total_s", 0.0) for g in result.get("gmis", []) if g.get("startup")]
    spent.append(
        f"the trainer took {max(starts):.0f} s to start" if starts else "the trainer was starting"
    )
    where = "; ".join(spent)
    if result.get("interrupted"):
        return f"no step was trained: the run was stopped during its start-up ({where})"
    if max_wall_s is None:
        return f"no step was trained: the run ended during its start-up ({where})"
    cache = " (a later run on this machine reads the probes from the cache)" if probed else ""
    return (
        f"no step was trained: --max-wall-s {max_wall_s:g} ran out during the start-up ({where}). "
        f"Give the run more time{cache}."
    )
