"""CURVE for a run's ``tcp://`` links: keys made per run, and a ZAP guard in every binding
process that admits only the run's own client key.

An ``ipc://`` link is a Unix socket in a private directory (0700), so only the run's user can
reach it. A ``tcp://`` link can be reached by anyone who can reach its address, so every TCP
link of a run is served with ZeroMQ CURVE: the traffic is encrypted, and each process that
binds one runs a ZAP handler (``Guard``) that admits only the run's client public key. The keys
are made fresh for each run (``RunKeys.generate``), live only in memory, travel to the run's own
processes with the rest of their start-up arguments, and are never written to a file, a command
line or a log. A peer that fails the handshake or offers another key is refused by libzmq before
any of its messages reach the socket; the guard counts the refusals it decides
(``Guard.refused``), and the run's result sums them as ``auth_refused``.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import zmq
from zmq.auth.thread import ThreadAuthenticator

logger = logging.getLogger(__name__)


class CurveError(RuntimeError):
    """CURVE is needed and this libzmq cannot do it."""


def need_curve() -> None:
    """Raises ``CurveError`` where libzmq was built without CURVE."""
    if not zmq.has("curve"):
        raise CurveError(
            f"this libzmq ({zmq.zmq_version()}) was built without CURVE: a run's tcp:// links "
            "cannot be authenticated here; use transport 'ipc' (the default)"
        )


@dataclass(frozen=True)
class RunKeys:
    """The run's server and client key pairs (Z85 bytes); secrets are never printed."""

    server_public: bytes
    server_secret: bytes
    client_public: bytes
    client_secret: bytes

    @classmethod
    def generate(cls) -> RunKeys:
        need_curve()
        server_public, server_secret = zmq.curve_keypair()
        client_public, client_secret = zmq.curve_keypair()
        return cls(server_public, server_secret, client_public, client_secret)

    def __repr__(self) -> str:
        return "RunKeys(<secret>)"

    def client_only(self) -> RunKeys:
        """The keys a process that only connects needs (a remote actor's): the server's
        secret left out, so such a process cannot serve the run's links."""
        return RunKeys(self.server_public, b"", self.client_public, self.client_secret)

    def serve(self, sock: zmq.Socket) -> None:
        """Makes ``sock`` (before its ``bind``) a CURVE server with the run's server pair."""
        if not self.server_secret:
            raise CurveError("these keys are a client's only (client_only): they cannot serve")
        sock.curve_secretkey = self.server_secret
        sock.curve_publickey = self.server_public
        sock.curve_server = True

    def client(self, sock: zmq.Socket) -> None:
        """Makes ``sock`` (before its ``connect``) a CURVE client with the run's client pair."""
        sock.curve_serverkey = self.server_public
        sock.curve_publickey = self.client_public
        sock.curve_secretkey = self.client_secret


class _Allow:
    """The ZAP callback: the run's client key only, refusals counted."""

    def __init__(self, allowed: bytes) -> None:
        self.allowed = allowed
        self.refused = 0
        """Written only by the authenticator's one thread; read by the process's reports."""

    def callback(self, domain: str, key: bytes) -> bool:
        if key == self.allowed:
            return True
        self.refused += 1
        n = self.refused
        if n & (n - 1) == 0:  # the 1st, 2nd, 4th, 8th...: a peer that retries cannot flood the log
            logger.warning(
                "refused %d connection(s) to this run's tcp:// links: their CURVE key is not the "
                "run's",
                n,
            )
        return False


class Guard:
    """A ZAP handler in ``ctx`` (one per process that binds a run's ``tcp://`` link; start it
    before the first ``bind``, stop it before the context ends)."""

    def __init__(self, ctx: zmq.Context, keys: RunKeys) -> None:
        self._allow = _Allow(keys.client_public)
        self._auth = ThreadAuthenticator(ctx)
        self._auth.start()
        self._auth.configure_curve_callback(domain="*", credentials_provider=self._allow)

    @property
    def refused(self) -> int:
        """Connections refused so far (their key was not the run's)."""
        return self._allow.refused

    def stop(self) -> None:
        self._auth.stop()


class NoGuard:
    """What a process that binds only ``ipc://`` or ``inproc://`` links has instead of a
    ``Guard``: nothing to refuse."""

    refused = 0

    def stop(self) -> None:
        pass
