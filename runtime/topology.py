"""Every socket of a training run, wired in one place (read top to bottom).

    actors[i].dispenser  PUSH --connect--> experience   PULL  compressor (bind)
    compressor           PUSH --connect--> chunks       PULL  migrator   (bind)
    migrator             ROUTER (bind)  <-> trainers     DEALER trainer[j] (connect)
                                            credits go up, chunk channels come down
    migrator             PUB  (bind)   --> receipts     SUB   actors[i]  (connect)
    trainer[0]           PUB  --connect--> weights_in   XSUB  runner's forwarder (bind)
    runner's forwarder   XPUB (bind)   --> weights      SUB   actors[i]  (connect)
    actors[i] (inference=gmi) DEALER --connect--> inference ROUTER inference GMI (bind)
                                            observations go up, actions come down
    runner's forwarder   XPUB (bind)   --> weights      SUB   inference GMI (connect)
    every process        PUSH --connect--> telemetry    PULL  runner     (bind)
    runner               PUB  (bind)   --> commands     SUB   compressor, migrator (connect)

The weights pass through a forwarder in the runner so that the publishing trainer can be
replaced during a run (a GMI hand-over) without anyone rebinding an address. Receipts (the
steps of each actor incarnation the migrator has handed to a trainer) come from the migrator,
which outlives every trainer generation.

Back-pressure is bounded everywhere: send/receive high-water marks below, the migrator's
credit window, and the compressor's bounded chunk. A full experience socket blocks the
sender (actors pause between rollouts); nothing is dropped. Weights are the exception:
a slow actor simply misses intermediate versions (only the newest matters).

The same components can be wired with ``inproc://`` endpoints inside one process (tests,
debugging), ``ipc://`` (Unix sockets in a private directory, the default), or ``tcp://`` on an
address the user names (loopback by default, never a wildcard unless named). Every ``tcp://``
link is served with CURVE and the run's own keys (``runtime.curve``): each process that binds
one starts a ``guard`` first, and every socket that connects to one is a CURVE client.
"""

from __future__ import annotations

import dataclasses
import os
import threading
from dataclasses import dataclass, field
from typing import Any

import zmq

from runtime import ports
from runtime.child_start import without_ctrl_c
from runtime.commands import CommandIn, CommandOut
from runtime.curve import CurveError, Guard, NoGuard, RunKeys, need_curve
from runtime.frame_limits import DATA_MAX_BYTES, SMALL_MAX_BYTES

EXPERIENCE_HWM = 256
"""Messages queued on each side of an actor->compressor link (one per channel per rollout)."""
CHUNK_HWM = 64
"""Messages queued on each side of the compressor->migrator link."""
TRAINER_HWM = 256
"""Messages queued on each side of a migrator<->trainer link (bounded again by credits)."""
WEIGHTS_HWM = 2
"""Weight messages queued per actor; older versions are dropped by PUB when it is full."""
RECEIPTS_HWM = 16
"""Receipt messages queued per actor (cumulative counts: a dropped one is superseded)."""
INFERENCE_HWM = 64
"""INFER/ACTIONS messages queued per actor (each actor has at most three outstanding)."""
TELEMETRY_HWM = 10_000
LINGER_MS = 10_000
"""How long a closing socket keeps trying to deliver what it has queued (drain at exit)."""


@dataclass(frozen=True)
class Endpoints:
    """Addresses of the links of one run, and the run's key: a random secret the runner hands
    its own processes (never a socket or a command line). The trainer signs every WEIGHTS
    message with it, and the actors and the inference GMI check it (``runtime.wire.weights_mac``);
    the compressor signs its chunks and end of stream, and the trainers their credits, and the
    migrator checks both (``runtime.wire.sign``). What anyone else sends there is dropped and
    counted."""

    experience: str
    chunks: str
    trainers: str
    receipts: str
    weights_in: str
    weights: str
    inference: str
    telemetry: str
    commands: str
    run_key: bytes = field(default_factory=lambda: os.urandom(32), repr=False)
    keys: RunKeys | None = field(default=None, repr=False)
    """The run's CURVE keys: set exactly when the links are ``tcp://``."""

    @classmethod
    def ipc(cls, run_dir: str) -> Endpoints:
        """Unix-socket endpoints inside ``run_dir`` (a private temp dir)."""
        return cls(**{name: f"ipc://{os.path.join(run_dir, name)}" for name in _LINKS})

    @classmethod
    def tcp(cls, host: str = "127.0.0.1") -> Endpoints:
        """TCP endpoints on free ports of ``host``, served with CURVE and fresh run keys.

        Raises:
            runtime.curve.CurveError: libzmq cannot do CURVE.
            ValueError: ``host`` is not an address of this machine.
        """
        keys = RunKeys.generate()
        port = {name: ports.free_port(host) for name in _LINKS}
        return cls(**{name: f"tcp://{_url_host(host)}:{port[name]}" for name in _LINKS}, keys=keys)

    @classmethod
    def of(cls, cfg: Any, run_dir: str) -> Endpoints:
        """A run's links (``cfg``: its ``TrainConfig``): ``ipc`` in ``run_dir``, or ``tcp`` on
        ``cfg.bind_host``."""
        return cls.ipc(run_dir) if cfg.transport == "ipc" else cls.tcp(cfg.bind_host)

    def release(self) -> None:
        """Lets go of the ports these links were held on (``runtime.ports``; the run ended)."""
        ports.release([getattr(self, name) for name in _LINKS])

    def for_clients(self) -> Endpoints:
        """These endpoints for a process that only connects (a remote actor): the CURVE
        server's secret left out (``RunKeys.client_only``)."""
        if self.keys is None:
            return self
        return dataclasses.replace(self, keys=self.keys.client_only())

    @classmethod
    def inproc(cls, prefix: str = "autotune") -> Endpoints:
        """In-process endpoints: every component must share one ``zmq.Context``."""
        return cls(**{name: f"inproc://{prefix}-{name}" for name in _LINKS})


_LINKS = (
    "experience",
    "chunks",
    "trainers",
    "receipts",
    "weights_in",
    "weights",
    "inference",
    "telemetry",
    "commands",
)


def tcp_problem(host: str) -> str | None:
    """Why a run's ``tcp://`` links cannot be served on ``host`` here (no CURVE in this
    libzmq, or an address this machine does not have), or None."""
    try:
        need_curve()
        ports.free_port(host, hold=False)
    except (CurveError, ValueError) as exc:
        return str(exc)
    return None


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def guard(ctx: zmq.Context, ep: Endpoints) -> Guard | NoGuard:
    """The ZAP guard a process that binds one of ``ep``'s links starts in ``ctx`` before it
    binds (a ``NoGuard`` where the links are not ``tcp://``); stop it before ``ctx`` ends."""
    return Guard(ctx, ep.keys) if ep.keys is not None else NoGuard()


def _tcp(sock: zmq.Socket, ep: Endpoints, address: str, server: bool) -> None:
    """A socket about to bind (``server``) or connect to a ``tcp://`` link: CURVE with the
    run's keys, and IPv6 where the address is one."""
    if ep.keys is not None and address.startswith("tcp://"):
        (ep.keys.serve if server else ep.keys.client)(sock)
    if address.startswith("tcp://["):
        sock.setsockopt(zmq.IPV6, 1)


def _bind(sock: zmq.Socket, ep: Endpoints, address: str) -> None:
    _tcp(sock, ep, address, server=True)
    sock.bind(address)


def _connect(sock: zmq.Socket, ep: Endpoints, address: str) -> None:
    _tcp(sock, ep, address, server=False)
    sock.connect(address)


def _socket(
    ctx: zmq.Context, kind: int, *, sndhwm: int = 1000, rcvhwm: int = 1000, maxmsg: int = -1
) -> zmq.Socket:
    """A socket with its high-water marks; ``maxmsg`` (bytes, for a bound input) makes libzmq
    disconnect a peer that sends a larger frame before it is read into memory."""
    sock = ctx.socket(kind)
    sock.setsockopt(zmq.SNDHWM, sndhwm)
    sock.setsockopt(zmq.RCVHWM, rcvhwm)
    sock.setsockopt(zmq.LINGER, LINGER_MS)
    sock.setsockopt(zmq.MAXMSGSIZE, maxmsg)
    return sock


# --- actors -------------------------------------------------------------------------------


def actor_experience_out(ctx: zmq.Context, ep: Endpoints) -> zmq.Socket:
    """The dispenser's PUSH to the compressor."""
    sock = _socket(ctx, zmq.PUSH, sndhwm=EXPERIENCE_HWM)
    _connect(sock, ep, ep.experience)
    return sock


def actor_weights_in(ctx: zmq.Context, ep: Endpoints) -> zmq.Socket:
    """An actor's SUB for versioned weights."""
    return _subscriber(ctx, ep, ep.weights, WEIGHTS_HWM)


def actor_receipts_in(ctx: zmq.Context, ep: Endpoints) -> zmq.Socket:
    """An actor's SUB for the migrator's receipts (only the newest matters)."""
    return _subscriber(ctx, ep, ep.receipts, RECEIPTS_HWM)


def actor_inference_out(ctx: zmq.Context, ep: Endpoints) -> zmq.Socket:
    """An actor's DEALER to the inference GMI (``inference='gmi'``)."""
    sock = _socket(ctx, zmq.DEALER, sndhwm=INFERENCE_HWM, rcvhwm=INFERENCE_HWM)
    sock.setsockopt(zmq.LINGER, 0)
    _connect(sock, ep, ep.inference)
    return sock


def _subscriber(ctx: zmq.Context, ep: Endpoints, endpoint: str, hwm: int) -> zmq.Socket:
    sock = _socket(ctx, zmq.SUB, rcvhwm=hwm)
    sock.setsockopt(zmq.SUBSCRIBE, b"")
    sock.setsockopt(zmq.LINGER, 0)
    _connect(sock, ep, endpoint)
    return sock


# --- compressor -----------------------------------------------------------------------------


def compressor_sockets(ctx: zmq.Context, ep: Endpoints) -> tuple[zmq.Socket, zmq.Socket, CommandIn]:
    """(experience PULL, chunks PUSH, commands SUB) of the compressor."""
    pull = _socket(ctx, zmq.PULL, rcvhwm=EXPERIENCE_HWM, maxmsg=DATA_MAX_BYTES)
    _bind(pull, ep, ep.experience)
    push = _socket(ctx, zmq.PUSH, sndhwm=CHUNK_HWM)
    _connect(push, ep, ep.chunks)
    return pull, push, command_in(ctx, ep)


def command_in(ctx: zmq.Context, ep: Endpoints) -> CommandIn:
    """A process's SUB for the runner's COMMAND messages (drain, retire, live, exit), which
    takes only those signed with the run's key, each once (``runtime.commands``)."""
    commands = _socket(ctx, zmq.SUB)
    commands.setsockopt(zmq.SUBSCRIBE, b"")
    _connect(commands, ep, ep.commands)
    return CommandIn(commands, ep.run_key)


# --- migrator -------------------------------------------------------------------------------


def migrator_sockets(
    ctx: zmq.Context, ep: Endpoints
) -> tuple[zmq.Socket, zmq.Socket, zmq.Socket, CommandIn]:
    """(chunks PULL, trainers ROUTER, receipts PUB, commands SUB) of the migrator."""
    pull = _socket(ctx, zmq.PULL, rcvhwm=CHUNK_HWM, maxmsg=DATA_MAX_BYTES)
    _bind(pull, ep, ep.chunks)
    kw = {"sndhwm": TRAINER_HWM, "rcvhwm": TRAINER_HWM, "maxmsg": SMALL_MAX_BYTES}
    router = _socket(ctx, zmq.ROUTER, **kw)
    router.setsockopt(zmq.ROUTER_MANDATORY, 1)
    _bind(router, ep, ep.trainers)
    receipts = _socket(ctx, zmq.PUB, sndhwm=RECEIPTS_HWM)
    receipts.setsockopt(zmq.LINGER, 0)
    _bind(receipts, ep, ep.receipts)
    return pull, router, receipts, command_in(ctx, ep)


# --- trainers -------------------------------------------------------------------------------


def trainer_name(rank: int, generation: int = 0) -> str:
    """A trainer GMI's identity and telemetry source: ``trainer-<rank>.g<generation>``."""
    return f"trainer-{rank}.g{generation}"


def trainer_experience_in(ctx: zmq.Context, ep: Endpoints, name: str) -> zmq.Socket:
    """A trainer's DEALER to the migrator, with identity ``name`` (see ``trainer_name``)."""
    sock = _socket(ctx, zmq.DEALER, sndhwm=TRAINER_HWM, rcvhwm=TRAINER_HWM)
    sock.setsockopt(zmq.IDENTITY, name.encode())
    _connect(sock, ep, ep.trainers)
    return sock


def trainer_weights_out(ctx: zmq.Context, ep: Endpoints) -> zmq.Socket:
    """The lead trainer's PUB of versioned weights, connected to the runner's forwarder."""
    sock = _socket(ctx, zmq.PUB, sndhwm=WEIGHTS_HWM)
    sock.setsockopt(zmq.LINGER, 0)
    _connect(sock, ep, ep.weights_in)
    return sock


class WeightsForwarder:
    """XSUB (``weights_in``) -> XPUB (``weights``) in a thread of the binding process.

    ``zmq.proxy_steerable`` runs in C without the GIL; ``stop`` terminates it through its
    control socket, so its sockets are only ever used by its own thread.
    """

    def __init__(self, ctx: zmq.Context, ep: Endpoints) -> None:
        self.ctx, self.ep = ctx, ep
        self._control_addr = f"inproc://weights-forwarder-{id(self)}"
        self._control = ctx.socket(zmq.PAIR)
        self._control.bind(self._control_addr)
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="weights-forwarder", daemon=True)

    def start(self) -> WeightsForwarder:
        without_ctrl_c(self._thread)
        self._ready.wait(10)
        if self._error is not None:
            raise self._error
        return self

    def _run(self) -> None:
        try:
            xsub = _socket(self.ctx, zmq.XSUB, rcvhwm=WEIGHTS_HWM)
            xsub.setsockopt(zmq.LINGER, 0)
            _bind(xsub, self.ep, self.ep.weights_in)
            xpub = _socket(self.ctx, zmq.XPUB, sndhwm=WEIGHTS_HWM)
            xpub.setsockopt(zmq.LINGER, 0)
            _bind(xpub, self.ep, self.ep.weights)
            control = self.ctx.socket(zmq.PAIR)
            control.connect(self._control_addr)
        except BaseException as exc:  # reported by start()
            self._error = exc
            self._ready.set()
            return
        self._ready.set()
        try:
            zmq.proxy_steerable(xsub, xpub, None, control)
        except zmq.ContextTerminated:
            pass
        finally:
            for sock in (xsub, xpub, control):
                sock.close(linger=0)

    def stop(self) -> None:
        if self._thread.is_alive():
            self._control.send(b"TERMINATE")
            self._thread.join(5)
        self._control.close(linger=0)


# --- inference GMI ---------------------------------------------------------------------------


def inference_sockets(ctx: zmq.Context, ep: Endpoints) -> tuple[zmq.Socket, zmq.Socket, CommandIn]:
    """(actors ROUTER, weights SUB, commands SUB) of the inference GMI."""
    kw = {"sndhwm": INFERENCE_HWM, "rcvhwm": INFERENCE_HWM, "maxmsg": DATA_MAX_BYTES}
    router = _socket(ctx, zmq.ROUTER, **kw)
    router.setsockopt(zmq.LINGER, 0)
    _bind(router, ep, ep.inference)
    return router, _subscriber(ctx, ep, ep.weights, WEIGHTS_HWM), command_in(ctx, ep)


# --- telemetry and commands ----------------------------------------------------------------


def telemetry_out(ctx: zmq.Context, ep: Endpoints) -> zmq.Socket:
    """Any process's PUSH of STATS messages to the runner."""
    sock = _socket(ctx, zmq.PUSH, sndhwm=TELEMETRY_HWM)
    _connect(sock, ep, ep.telemetry)
    return sock


def runner_sockets(ctx: zmq.Context, ep: Endpoints) -> tuple[zmq.Socket, CommandOut]:
    """(telemetry PULL, commands PUB) of the runner; its commands are signed with the run's
    key and numbered (``runtime.commands``)."""
    pull = _socket(ctx, zmq.PULL, rcvhwm=TELEMETRY_HWM, maxmsg=SMALL_MAX_BYTES)
    _bind(pull, ep, ep.telemetry)
    pub = _socket(ctx, zmq.PUB)
    _bind(pub, ep, ep.commands)
    return pull, CommandOut(pub, ep.run_key)
