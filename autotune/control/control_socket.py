"""The daemon's control socket: a ZeroMQ ROUTER bound on its endpoint, private to its user (an
``ipc://`` socket file made 0600 from its first moment; ``tcp://`` with CURVE and an allow-list
of client keys, ``autotune.control.keys``), and the socket file cleared where a daemon killed
outright left it. Only a socket is removed from the endpoint's path: whatever else is there is
left as it is."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

import zmq

from autotune.control.home import ControlError
from autotune.control.keys import serve_curve
from autotune.control.protocol import ipc_path


def remove_socket_file(path: Path) -> None:
    """Removes the socket file at ``path``; nothing there is fine.

    Raises:
        ControlError: something other than a socket is there (a regular file, a link, a
            directory): it is left as it is, and the message names the path.
    """
    try:
        mode = path.lstat().st_mode
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(mode):
        raise ControlError(
            f"{path} is not a socket, so the daemon neither removes it nor binds there; the "
            "path of an ipc:// endpoint must be free or hold a socket a daemon left: move what "
            "is there, or give --control another ipc:// path"
        )
    path.unlink(missing_ok=True)


def bind_router(ctx: zmq.Context, endpoint: str) -> tuple[zmq.Socket, Any]:
    """A ROUTER bound on ``endpoint``, and its ZAP authenticator (None on ``ipc://``).

    Raises:
        ControlError: the endpoint's path holds something other than a socket, or a
            ``tcp://`` endpoint has no keys to serve with.
        zmq.ZMQError: it cannot be bound.
    """
    path = ipc_path(endpoint)
    if path is not None:
        remove_socket_file(path)  # left by a daemon that was killed
    sock = ctx.socket(zmq.ROUTER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
    auth = None
    try:
        if path is None:  # tcp: every local user can reach it, so CURVE with an allow-list
            auth = serve_curve(ctx, sock)
        mask = os.umask(0o077)  # the socket file is the owner's from its first moment
        try:
            sock.bind(endpoint)
        finally:
            os.umask(mask)
    except (ControlError, zmq.ZMQError):
        sock.close(linger=0)
        if auth is not None:
            auth.stop()
        raise
    if path is not None:
        path.chmod(0o600)
    return sock, auth
