"""The user's private directory for the control plane (the daemon's socket, pid, log and CURVE
keys), and the error for a control endpoint or directory that is not allowed."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable
from pathlib import Path
from typing import Any


class ControlError(ValueError):
    """A control endpoint that is not allowed, or a state dir that is not private."""


def state_dir() -> Path:
    """The private directory for the daemon's socket, pid and log (created 0700 if missing).

    Raises:
        ControlError: if it exists but another user owns it or others can write to it.
    """
    if os.environ.get("AUTOTUNE_HOME"):
        # Absolute: the daemon runs from "/", and a job or client from anywhere.
        path = Path(os.environ["AUTOTUNE_HOME"]).absolute()
    elif os.environ.get("XDG_RUNTIME_DIR"):
        path = Path(os.environ["XDG_RUNTIME_DIR"]) / "autotune"
    else:
        path = Path(f"/tmp/autotune-{os.getuid()}")
    return private_dir(path, "state dir", hint=" (set AUTOTUNE_HOME to another directory)")


def private_dir(path: Path, what: str, closed: bool = False, hint: str = "") -> Path:
    """``path``, created 0700 if missing.

    Raises:
        ControlError: another user owns it, or others can write to it (``closed``: others
            can read or enter it at all).
    """
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    info = path.stat()
    bad = (stat.S_IRWXG | stat.S_IRWXO) if closed else (stat.S_IWGRP | stat.S_IWOTH)
    if info.st_uid != os.getuid() or info.st_mode & bad:
        rule = "closed to others (0700)" if closed else "writable by you only"
        raise ControlError(
            f"{what} {path} is not private (owner uid {info.st_uid}, mode "
            f"{stat.filemode(info.st_mode)}); it must be yours and {rule}{hint}"
        )
    return path


def _take(path: Path, holder: str) -> tuple[Any, str | None]:
    """An exclusive lock on ``path``, held while the returned file stays open (the kernel drops
    it when the process ends, however it ends), with ``holder`` written in it; or ``(None, what
    the process holding it wrote there)``."""
    import fcntl

    f = open(path, "a+")  # noqa: SIM115 - held open for the process's life
    try:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        f.seek(0)
        other = f.read().strip() or "unknown"
        f.close()
        return None, other
    f.seek(0)
    f.truncate()
    f.write(holder)
    f.flush()
    return f, None


def hold_lock(name: str, what: str) -> Any:
    """An exclusive lock on ``<state dir>/name``, held while the returned file stays open.

    Raises:
        ControlError: another process holds it (its pid, as it wrote it there).
    """
    path = state_dir() / name
    f, other = _take(path, str(os.getpid()))
    if f is None:
        raise ControlError(
            f"{what} already runs with the state dir {path.parent} (pid {other}); "
            "one per state dir (set AUTOTUNE_HOME for another)"
        )
    return f


def machine_locks_dir() -> Path:
    """Where daemons lock the cores and GPUs they hand out (``hold_machine``): one directory per
    user, whatever each daemon's state dir (``AUTOTUNE_MACHINE_LOCKS`` moves it)."""
    path = os.environ.get("AUTOTUNE_MACHINE_LOCKS") or f"/tmp/autotune-machine-{os.getuid()}"
    return private_dir(
        Path(path).absolute(),
        "machine lock dir",
        hint=" (set AUTOTUNE_MACHINE_LOCKS to another directory)",
    )


def hold_machine(cores: Iterable[int], gpus: Iterable[int]) -> list[Any]:
    """Exclusive locks on each of ``cores`` and ``gpus`` (what a daemon hands out or keeps), held
    while the returned files stay open: two daemons of one user never hand out one core or GPU,
    even with different state dirs. Each lock file says which daemon holds it (its pid and
    state dir).

    Raises:
        ControlError: another daemon holds some of them (which, by whom), with what to do.
    """
    where = machine_locks_dir()
    me = f"{os.getpid()} {state_dir()}"
    held: list[Any] = []
    taken: dict[str, list[str]] = {}
    for kind, ids in (("core", cores), ("GPU", gpus)):
        for i in ids:
            f, other = _take(where / f"{kind.lower()}-{int(i)}.lock", me)
            if f is None:
                taken.setdefault(other or "unknown", []).append(f"{kind} {i}")
            else:
                held.append(f)
    if taken:
        for f in held:
            f.close()
        who = "; ".join(
            f"{', '.join(what)} by the daemon {_holder(holder)}" for holder, what in taken.items()
        )
        raise ControlError(
            f"another daemon already hands out {who}. One daemon per machine, or daemons on "
            "disjoint CPU sets and GPUs: start this one with a CPU set that leaves those out "
            "(taskset -c ...) and CUDA_VISIBLE_DEVICES, or stop the other (autotune daemon "
            "stop, with AUTOTUNE_HOME set to its state dir)"
        )
    return held


def _holder(line: str) -> str:
    pid, _, home = line.partition(" ")
    return f"pid {pid}" + (f" (state dir {home})" if home else "")
