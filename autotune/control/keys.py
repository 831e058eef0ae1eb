"""CURVE keys for the daemon's TCP control endpoint (``autotune daemon keys``).

An ``ipc://`` control socket is a file only its user can open (0600 in a 0700 directory), so it
needs nothing more. A ``tcp://`` one can be reached by every local user, so the daemon serves it
only with ZeroMQ CURVE: the traffic is encrypted, and a ZAP handler admits only the client
public keys in the allow-list.

The keys live in ``$AUTOTUNE_KEYS``, else ``<state dir>/keys`` (created 0700; the state dir is
``autotune.control.home.state_dir``):

    server.key          the daemon's public key (clients need it)
    server.key_secret   the daemon's secret key (the daemon only)
    client.key          a client's public key
    client.key_secret   a client's secret key (jobs, ``status`` and ``stop`` use this pair)
    authorized/         the allow-list: every ``*.key`` here may connect

``generate`` writes a server pair, a client pair, and the client's public key into the
allow-list. To admit another client pair (another user's jobs, say), put its ``.key`` file in
``authorized/``; the daemon reads the allow-list when it starts. Secret files are 0600 and no
key is ever printed or logged.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import zmq
import zmq.auth
from zmq.auth.thread import ThreadAuthenticator

from autotune.control.home import ControlError, private_dir, state_dir

FILES = ("server.key", "server.key_secret", "client.key", "client.key_secret")


def keys_dir() -> Path:
    """Where the keys are: ``$AUTOTUNE_KEYS``, else ``<state dir>/keys``."""
    if os.environ.get("AUTOTUNE_KEYS"):  # absolute: the daemon runs from "/"
        return Path(os.environ["AUTOTUNE_KEYS"]).absolute()
    return state_dir() / "keys"


def _need_curve() -> None:
    if not zmq.has("curve"):
        raise ControlError(
            f"this libzmq ({zmq.zmq_version()}) was built without CURVE: a tcp:// control "
            "endpoint cannot be authenticated here; use the default ipc:// endpoint"
        )


def generate(path: Path | None = None, force: bool = False) -> tuple[Path, bool]:
    """Writes a server and a client key pair into ``path`` (default ``keys_dir()``) and allows
    the client's public key. Existing keys are kept unless ``force``.

    Returns:
        The directory, and whether new keys were written.

    Raises:
        ControlError: the directory is not private, or CURVE is not available.
    """
    _need_curve()
    path = path or keys_dir()
    private_dir(path, "key dir", closed=True)
    if all((path / f).exists() for f in FILES) and not force:
        return path, False
    allowed = path / "authorized"
    if force and allowed.exists():
        old = allowed / "client.key"
        if old.exists():
            old.unlink()  # the old client may connect no more
    for name in ("server", "client"):
        public, secret = zmq.auth.create_certificates(str(path), name)
        os.chmod(secret, 0o600)
        os.chmod(public, 0o644)
    private_dir(allowed, "key dir", closed=True)
    shutil.copyfile(path / "client.key", allowed / "client.key")
    return path, True


def _load(path: Path, name: str, secret: bool) -> tuple[bytes, bytes | None]:
    file = path / (f"{name}.key_secret" if secret else f"{name}.key")
    try:
        public, secret_key = zmq.auth.load_certificate(str(file))
    except (OSError, ValueError):
        raise ControlError(
            f"no CURVE key {file}: a tcp:// control endpoint needs keys; run "
            "`autotune daemon keys` (or set AUTOTUNE_KEYS to the directory that holds them)"
        ) from None
    if secret and secret_key is None:
        raise ControlError(f"{file} holds no secret key")
    return public, secret_key


def serve_curve(
    ctx: zmq.Context, sock: zmq.Socket, path: Path | None = None
) -> ThreadAuthenticator:
    """Makes ``sock`` (not yet bound) a CURVE server that admits only the allow-listed client
    keys; returns the running ZAP authenticator (stop it when the socket closes).

    Raises:
        ControlError: no keys, no allow-list, or CURVE not available.
    """
    _need_curve()
    path = path or keys_dir()
    private_dir(path, "key dir", closed=True)
    public, secret = _load(path, "server", secret=True)
    allowed = path / "authorized"
    if not allowed.is_dir() or not any(allowed.glob("*.key")):
        raise ControlError(
            f"no allowed client keys in {allowed}: run `autotune daemon keys`, or put a "
            "client's .key file there"
        )
    auth = ThreadAuthenticator(ctx)
    auth.start()
    auth.configure_curve(domain="*", location=str(allowed))
    sock.curve_secretkey = secret
    sock.curve_publickey = public
    sock.curve_server = True
    return auth


def connect_curve(sock: zmq.Socket, path: Path | None = None) -> None:
    """Makes ``sock`` (not yet connected) a CURVE client with the client pair and the
    daemon's public key.

    Raises:
        ControlError: no keys, or CURVE not available.
    """
    _need_curve()
    path = path or keys_dir()
    server, _ = _load(path, "server", secret=False)
    public, secret = _load(path, "client", secret=True)
    sock.curve_serverkey = server
    sock.curve_publickey = public
    sock.curve_secretkey = secret
