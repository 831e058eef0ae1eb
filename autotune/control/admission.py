"""What the daemon accepts from its control socket beyond the message format: a registration
from its job's own process, with its token (on ``tcp://``, where no process can be named, an
offer and a registration for a pid from the client key that made its pending offer); a file
path that comes in a message is checked before anything opens it (a forged registration must
not make the daemon create or write a file of the sender's choosing); and a study tuned for one
job at a time."""

from __future__ import annotations

import os
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any

from autotune.control import protocol
from autotune.control.claims import sender_pid
from autotune.control.home import state_dir
from autotune.tuning.storage import storage_url
from autotune.tuning.url_secrets import redact


def sender_problem(msg: dict[str, Any], peer: int | None, registered: Any) -> str | None:
    """Why a HELLO is not taken from its sender, or None: no well-formed session token, a pid
    not the sender's (``claims.sender_pid``; ``peer``: the sender's, on ``ipc://``), or a job
    registered already (``registered``: its HELLO) with another token."""
    problem = protocol.token_problem(msg.get("token"))
    try:
        sender_pid(msg, peer)
    except ValueError as exc:
        problem = problem or str(exc)
    if (
        problem is None
        and registered is not None
        and not protocol.token_matches(registered["token"], msg)
    ):
        problem = protocol.not_its_token(str(msg.get("job")))
    return problem


class OfferOwners:
    """Which allow-listed client key made each pending offer, on a ``tcp://`` control socket.
    There the daemon cannot check the pid a message names (``claims.sender_pid`` can on
    ``ipc://``), so an OFFER or a HELLO for a pid whose offer is pending from another key is
    refused: one client cannot replace or take the budget offered to another's process.

    Args:
        pending: Whether the offer for a pid is still pending (not lapsed, not registered).
    """

    def __init__(self, pending: Callable[[int], bool]) -> None:
        self.pending = pending
        self.keys: dict[int, str] = {}

    def problem(self, pid: int | None, key: str | None) -> str | None:
        """Why a message for ``pid`` from the client ``key`` (None: ``ipc://``) is refused,
        or None."""
        owner = self.keys.get(pid) if key is not None and pid is not None else None
        if owner is None or owner == key or not self.pending(pid):
            return None
        return (
            f"process {pid} has an offer pending from another client key; a client offers "
            "and registers only for the processes it started"
        )

    def note(self, pid: int, key: str | None) -> None:
        """``key`` made the offer now pending for ``pid``; lapsed and taken offers are
        forgotten."""
        self.keys = {p: k for p, k in self.keys.items() if p != pid and self.pending(p)}
        if key is not None:
            self.keys[pid] = key


def study_problem(msg: dict[str, Any], hellos: dict[str, dict[str, Any]]) -> str | None:
    """Why the study a HELLO names cannot be tuned for it (its ``env`` is not a name, or the
    study is for another registered job, whose registration is in ``hellos`` by job id), or
    None. Two URLs of one database name one study: ``sqlite:///a//s.db``, a linked folder or
    another driver (``sqlite+pysqlite://``) as much as the same text."""
    if not isinstance(msg.get("env"), str):
        return f"env must be an environment id (a string); got {type(msg.get('env')).__name__}"
    study = (_database(msg.get("storage")), msg.get("study"))
    for job, hello in hellos.items():
        if (_database(hello["storage"]), hello["study"]) == study:
            return (
                f"study {msg.get('study')!r} is being tuned for job {job} (pid "
                f"{hello.get('pid')}); give this job another --study"
            )
    return None


def _database(url: Any) -> Any:
    """What ``url`` names, made comparable: a SQLite file's real path, a server's backend,
    host, port and database; ``url`` itself where it does not parse."""
    from sqlalchemy.engine import make_url

    try:
        parsed = make_url(storage_url(url))
        name = parsed.database
        if parsed.get_backend_name() == "sqlite" and name and name != ":memory:":
            name = os.path.realpath(name)
        return (parsed.get_backend_name(), parsed.host, parsed.port, name)
    except Exception:  # not a URL, a NUL byte in the path: compared as given
        return url


def storage_problem(url: Any) -> str | None:
    """Why the daemon will not open the storage a HELLO names, or None. A file path that comes
    in over the socket may name a file the daemon would create: only under the daemon's state
    dir may it be new. Elsewhere it must already exist (the job creates its study before it
    registers) as a regular file of the daemon's user, not a link. Every SQLite URL is read so,
    whatever its driver (``sqlite+pysqlite://``); a SQLite URI filename (``uri=true``) is
    refused."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    if not isinstance(url, str):
        return f"the storage must be a URL string, got {type(url).__name__}"
    if "\0" in url:
        return "the storage URL holds a NUL byte; allowed: sqlite:///PATH or a server's URL"
    try:
        parsed = make_url(storage_url(url))
    except (ArgumentError, ValueError):
        return (
            f"the storage {redact(url)!r} is not a database URL; allowed: sqlite:///PATH or a "
            "database server's URL"
        )
    if parsed.get_backend_name().lower() != "sqlite":
        return None  # a database server: nothing is created on this host
    if "uri" in parsed.query:
        return (
            f"the storage {url!r} has a uri option: a SQLite URI filename is not opened from a "
            "message; allowed: sqlite:///PATH with no uri option"
        )
    if not parsed.database or parsed.database == ":memory:":
        return None  # in memory: no file
    return _file_problem(Path(parsed.database).absolute())


def _file_problem(path: Path) -> str | None:
    """Why the daemon will not open the SQLite file at ``path`` (see ``storage_problem``)."""
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
