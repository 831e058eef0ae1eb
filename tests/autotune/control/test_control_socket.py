"""The daemon's ``ipc://`` socket file: the one a killed daemon left is removed before the
daemon binds, and its own as it stops; whatever else is at the path (a file, a link) is left as
it is, and binding there is refused naming the path."""

from __future__ import annotations

import logging
import signal
import socket

import pytest

from autotune.control.daemon import Daemon
from autotune.control.home import ControlError
from autotune.control.machine import MachineView


def _daemon(path) -> Daemon:
    return Daemon(f"ipc://{path}", machine=MachineView.from_dict({"cores": 2}))


def _left_socket(path) -> None:
    """A socket file at ``path`` with nothing listening, as a daemon killed outright leaves."""
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(str(path))


def test_only_a_socket_at_the_ipc_path_is_removed_on_bind_and_on_stop(
    tmp_path, monkeypatch, caplog
):
    monkeypatch.setenv("AUTOTUNE_HOME", str(tmp_path / "home"))
    path = tmp_path / "control.sock"
    target = tmp_path / "target"
    target.write_text("the user's file")
    for planted in ("file", "link"):
        if planted == "file":
            path.write_text("the user's file")
        else:
            path.symlink_to(target)
        daemon = _daemon(path)
        try:
            with pytest.raises(ControlError, match=f"{path} is not a socket, so the daemon"):
                daemon.bind()
        finally:
            daemon.lock.close()
            daemon.ctx.destroy(linger=0)
        assert path.is_symlink() == (planted == "link") and path.read_text() == "the user's file"
        path.unlink()
    assert target.read_text() == "the user's file"

    _left_socket(path)
    daemon = _daemon(path)
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        daemon.bind()  # the socket left there is replaced by its own
        assert path.is_socket() and path.stat().st_mode & 0o777 == 0o600
        path.unlink()  # a file put at the path while it ran
        path.write_text("put here since")
        daemon.stopping = True
        with caplog.at_level(logging.WARNING):
            daemon.serve()  # stops at once, removing its socket file: not this file
    finally:
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
        daemon.lock.close()
    assert path.read_text() == "put here since"
    assert any(f"{path} is not a socket" in r.getMessage() for r in caplog.records)
