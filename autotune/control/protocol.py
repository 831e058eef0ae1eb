"""The control plane's one protocol: where the daemon's socket lives, and every message that
crosses a control socket (``MsgType``), between a training job and the daemon, a client and the
daemon, and a wrapped script and its wrapper.

Where: ``ipc://<state dir>/control.sock``. The state dir is private to the user (created 0700,
refused if another user owns it or others can write to it): ``$AUTOTUNE_HOME``, else
``$XDG_RUNTIME_DIR/autotune``, else ``/tmp/autotune-<uid>``. ``--control`` (or
``$AUTOTUNE_CONTROL``) picks another ``ipc://`` path or a loopback ``tcp://127.0.0.1:PORT``;
any other address is refused, since whoever reaches the socket can reconfigure jobs. A
``tcp://`` endpoint is served and reached only with ZeroMQ CURVE and an allow-list of client
keys (``autotune.control.keys``; ``autotune daemon keys`` makes them). A wrapped
script reaches its wrapper on a private ``ipc://`` socket named in ``$AUTOTUNE_WRAP``.

Messages: one frame, a msgpack map ``{"v": PROTOCOL_VERSION, "type": TYPE, ...}`` (a ROUTER
adds the peer's identity frame in front). Nothing off the socket is unpickled.

    job     -> daemon   OFFER    before it sizes itself: its claim; the daemon answers OFFER
                                 with the budget it would get now (or ERROR: refused)
                        HELLO    register: job id, pid, env, study, storage, settings, knobs,
                                 base, claim (weight, min share, exclusive, fixed budget, GPU),
                                 and the job's session token (``new_token``)
                        REPORT   every REPORT_INTERVAL_S: counters, settled, config, applied
                                 seq, the budget seq it has taken; and the token
                        BYE      the job is ending; and the token
    daemon  -> job      WELCOME  registered          ERROR  refused, with the reason
                        APPLY    seq + knob values   WHO    unknown job: send HELLO again
                        BUDGET   seq + cores, GPU, MPS share: pin to these, stay within
                        FAREWELL the tuning section for the job's result
    client  -> daemon   PING, STATUS, STOP;  daemon -> client  PONG, STATUS, STOPPING
    script  -> wrapper  PROGRESS the script's running step total and metrics
                        POLL     live mode: the script is at a safe point, has taken seq
    wrapper -> script   KNOBS    live mode: seq + new knob values

A job's token is a secret it chose for its registration: the daemon takes a REPORT or BYE for a
job, and a HELLO that registers it again, only with the token it registered with, so no other
client of the socket can speak for it, end its tuning or drop its session. On ``ipc://`` the
daemon also takes an OFFER or a HELLO only for the pid that sent it (``peer_pid``). A HELLO
that the registered job sent again on the same socket (one per WHO, queued while the daemon
was slow) is answered WELCOME with ``again``: the registration goes on as it was.
"""

from __future__ import annotations

import hmac
import ipaddress
import os
import re
import secrets
from enum import Enum
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import msgpack
import zmq

from autotune.control.home import ControlError, state_dir
from autotune.control.keys import connect_curve

PROTOCOL_VERSION = 2
"""2: a job's messages carry its session token."""
REPORT_INTERVAL_S = 0.5
"""How often a registered job reports its counters."""
JOB_SILENT_S = 10.0
"""A job that has not reported for this long, and whose process is gone, is dropped by the
daemon (its trial failed)."""
JOB_BUSY_S = 60.0
"""A job whose process still runs is dropped after this long without a report: starting many
actors or a GMI hand-over on a loaded machine can hold its loop for more than ``JOB_SILENT_S``."""


def too_silent(silent_s: float, pid: Any) -> bool:
    """Whether the daemon drops the job with process ``pid`` (on this machine) after
    ``silent_s`` without a report: past ``JOB_SILENT_S`` if its process is gone, past
    ``JOB_BUSY_S`` if it runs (the process is looked up only once the first has passed)."""
    if silent_s <= JOB_SILENT_S:
        return False
    from autotune.control.claims import process_gone  # a zombie has ended

    ok = isinstance(pid, int) and not isinstance(pid, bool) and pid > 0
    return silent_s > JOB_BUSY_S or not ok or process_gone(pid)


REQUEST_TIMEOUT_S = 3.0
"""How long a client or a registering job waits for the daemon's answer."""
APPLY_RESEND_S = 2.0
"""An APPLY the job has not acknowledged is sent again after this long."""


class MsgType(str, Enum):
    """Every message type of the control plane (see the module docstring for who sends it)."""

    HELLO = "HELLO"
    REPORT = "REPORT"
    BYE = "BYE"
    WELCOME = "WELCOME"
    ERROR = "ERROR"
    APPLY = "APPLY"
    WHO = "WHO"
    FAREWELL = "FAREWELL"
    PING = "PING"
    STATUS = "STATUS"
    STOP = "STOP"
    PONG = "PONG"
    STOPPING = "STOPPING"
    PROGRESS = "PROGRESS"
    POLL = "POLL"
    KNOBS = "KNOBS"
    BUDGET = "BUDGET"
    OFFER = "OFFER"

    def __str__(self) -> str:
        return self.value


JOB_TYPES = (MsgType.OFFER, MsgType.HELLO, MsgType.REPORT, MsgType.BYE)
"""What a training job sends the daemon."""
CLIENT_TYPES = (MsgType.PING, MsgType.STATUS, MsgType.STOP)
"""What ``autotune daemon`` and ``autotune status`` send the daemon."""
DAEMON_TAKES = JOB_TYPES + CLIENT_TYPES
SCRIPT_TYPES = (MsgType.PROGRESS, MsgType.POLL)
"""What a wrapped script sends its wrapper."""


TOKEN_HEX = 32
"""A job's session token: this many hex digits (128 bits)."""


def new_token() -> str:
    """A new session token for one job's registration."""
    return secrets.token_hex(TOKEN_HEX // 2)


def token_problem(token: Any) -> str | None:
    """Why ``token`` (from a HELLO) is not a session token, or None. Never shows the value."""
    if isinstance(token, str) and re.fullmatch(f"[0-9a-f]{{{TOKEN_HEX}}}", token):
        return None
    got = "none" if token is None else f"a {type(token).__name__}"
    return f"a HELLO carries the job's session token, {TOKEN_HEX} lowercase hex digits; got {got}"


def token_matches(expected: str, msg: dict[str, Any]) -> bool:
    """Whether ``msg`` carries the session token ``expected`` (compared in constant time)."""
    got = msg.get("token")
    return isinstance(got, str) and hmac.compare_digest(got.encode(), expected.encode())


def peer_pid(frame: zmq.Frame) -> int | None:
    """The process that sent ``frame`` (received with ``copy=False``) on an ``ipc://`` socket,
    as the kernel names it (``SO_PEERCRED``: libzmq's ``Peer-Address`` ends ``:uid:gid:pid``);
    None on ``tcp://``, where no process can be named."""
    try:
        address = frame.get("Peer-Address")
    except zmq.ZMQError:
        return None
    parts = str(address).rsplit(":", 3)
    return int(parts[3]) if len(parts) == 4 and parts[3].isdigit() else None


def peer_key(frame: zmq.Frame) -> str | None:
    """The CURVE public key (Z85) a ``tcp://`` sender of ``frame`` was admitted with (ZAP's
    ``User-Id``: ``autotune.control.keys``); None on ``ipc://``, where no key is used."""
    try:
        key = frame.get("User-Id")
    except zmq.ZMQError:
        return None
    return str(key) or None


def not_its_token(job_id: str) -> str:
    """The daemon's answer to a message for job ``job_id`` without its session token."""
    return (
        f"job {job_id} is registered with another session token; only the job's own "
        "process, with the token it registered with, reports for it, ends it or registers it "
        "again"
    )


def resolve_endpoint(endpoint: str | None = None) -> str:
    """The control endpoint: ``endpoint``, else ``$AUTOTUNE_CONTROL``, else the state dir's.

    Raises:
        ControlError: for anything but ``ipc://PATH`` or ``tcp://`` on a loopback address.
    """
    endpoint = endpoint or os.environ.get("AUTOTUNE_CONTROL") or None
    if endpoint is None:
        return f"ipc://{state_dir() / 'control.sock'}"
    if endpoint.startswith("ipc://") and len(endpoint) > len("ipc://"):
        # A relative socket path names a different socket from the daemon's cwd ("/").
        return "ipc://" + os.path.abspath(endpoint[len("ipc://") :])
    url = urlparse(endpoint)
    if url.scheme == "tcp" and url.hostname and url.port:
        try:
            loopback = url.hostname == "localhost" or ipaddress.ip_address(url.hostname).is_loopback
        except ValueError:
            loopback = False
        if loopback and ":" in url.hostname:  # ZeroMQ sockets here are IPv4 only
            raise ControlError(
                f"control endpoint {endpoint!r}: IPv6 is not served; use tcp://127.0.0.1:PORT"
            )
        if loopback:
            host = "127.0.0.1" if url.hostname == "localhost" else url.hostname
            return f"tcp://{host}:{url.port}"
    raise ControlError(
        f"control endpoint {endpoint!r} is not allowed: use ipc://PATH or "
        "tcp://127.0.0.1:PORT (loopback only: it reconfigures jobs)"
    )


def ipc_path(endpoint: str) -> Path | None:
    """The socket file of an ``ipc://`` endpoint, else None."""
    return Path(endpoint[len("ipc://") :]) if endpoint.startswith("ipc://") else None


def encode(kind: MsgType, **body: Any) -> bytes:
    """One message of type ``kind`` with ``body``'s fields."""
    return msgpack.packb(
        {"v": PROTOCOL_VERSION, "type": MsgType(kind).value, **body}, use_bin_type=True
    )


def decode(frame: bytes) -> dict[str, Any]:
    """The message in ``frame``, its ``type`` a ``MsgType``.

    Raises:
        ValueError: for bytes that are not a map of this protocol version with a known type.
    """
    try:
        msg = msgpack.unpackb(frame, raw=False, strict_map_key=False)
    except Exception as exc:  # msgpack raises several kinds for bad bytes
        raise ValueError(f"undecodable control message: {type(exc).__name__}: {exc}") from None
    if not isinstance(msg, dict) or not isinstance(msg.get("type"), str):
        raise ValueError("control message is not a map with a 'type'")
    if msg.get("v") != PROTOCOL_VERSION:
        raise ValueError(
            f"control protocol version {msg.get('v')!r}; this side speaks {PROTOCOL_VERSION} "
            "(run the same autotune version on both sides)"
        )
    try:
        msg["type"] = MsgType(msg["type"])
    except ValueError:
        raise ValueError(
            f"unknown message type {msg['type']!r}; allowed: {[m.value for m in MsgType]}"
        ) from None
    return msg


def dealer(ctx: zmq.Context, endpoint: str) -> zmq.Socket:
    """A DEALER connected to the daemon that never queues for an absent peer (sends fail with
    ``zmq.Again`` instead of piling up while no daemon runs) and never lingers on close."""
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.IMMEDIATE, 1)
    if endpoint.startswith("tcp://"):
        try:
            connect_curve(sock)  # a tcp:// daemon admits only allow-listed CURVE keys
        except ControlError:
            sock.close(linger=0)
            raise
    sock.connect(endpoint)
    return sock


def daemon_present(endpoint: str) -> bool:
    """Cheap check before waiting for an answer: an ipc socket file exists (a TCP endpoint
    may always be present)."""
    path = ipc_path(endpoint)
    return path is None or path.exists()


def request(
    endpoint: str, kind: MsgType, timeout_s: float = REQUEST_TIMEOUT_S, **body: Any
) -> dict[str, Any] | None:
    """Sends one client message and returns the daemon's answer, or None if no daemon
    answered within ``timeout_s``."""
    if not daemon_present(endpoint):
        return None
    ctx = zmq.Context.instance()
    sock = dealer(ctx, endpoint)
    try:
        deadline_ms = int(timeout_s * 1000)
        if not sock.poll(deadline_ms, zmq.POLLOUT):
            return None
        sock.send(encode(kind, **body))
        if not sock.poll(deadline_ms):
            return None
        return decode(sock.recv())
    finally:
        sock.close(linger=0)
