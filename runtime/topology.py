"""Every socket of a training run, wired in one place (read top to bottom).

    actors[i].dispenser  PUSH --connect--> experience   PULL  compressor (bind)
    compressor           PUSH --connect--> chunks       PULL  migrator   (bind)
    migrator             ROUTER (bind)  <-> trainers     DEALER trainer[j] (connect)
                                            credits go up, chunk channels come down
    trainer[0]           PUB  (bind)   --> weights      SUB   actors[i]  (connect)
    every process        PUSH --connect--> telemetry    PULL  runner     (bind)
    runner               PUB  (bind)   --> control      SUB   compressor, migrator (connect)

Back-pressure is bounded everywhere: send/receive high-water marks below, the migrator's
credit window, and the compressor's bounded chunk. A full experience socket blocks the
sender (actors pause between rollouts); nothing is dropped. Weights are the exception:
a slow actor simply misses intermediate versions (only the newest matters).

The same components can be wired with ``inproc://`` endpoints inside one process (tests,
debugging), ``ipc://`` (Unix sockets in a private directory, the default), or ``tcp://``
(loopback now; other hosts later).
"""

from __future__ import annotations

import os
import socket as pysocket
from dataclasses import dataclass

import zmq

EXPERIENCE_HWM = 256
"""Messages queued on each side of an actor->compressor link (one per channel per rollout)."""
CHUNK_HWM = 64
"""Messages queued on each side of the compressor->migrator link."""
TRAINER_HWM = 256
"""Messages queued on each side of a migrator<->trainer link (bounded again by credits)."""
WEIGHTS_HWM = 2
"""Weight messages queued per actor; older versions are dropped by PUB when it is full."""
TELEMETRY_HWM = 10_000
LINGER_MS = 10_000
"""How long a closing socket keeps trying to deliver what it has queued (drain at exit)."""


@dataclass(frozen=True)
class Endpoints:
    """Addresses of the six links of one run."""

    experience: str
    chunks: str
    trainers: str
    weights: str
    telemetry: str
    control: str

    @classmethod
    def ipc(cls, run_dir: str) -> Endpoints:
        """Unix-socket endpoints inside ``run_dir`` (a private temp dir)."""
        return cls(**{name: f"ipc://{os.path.join(run_dir, name)}" for name in _LINKS})

    @classmethod
    def tcp(cls, host: str = "127.0.0.1") -> Endpoints:
        """TCP endpoints on free ports of ``host``."""
        return cls(**{name: f"tcp://{host}:{_free_port(host)}" for name in _LINKS})

    @classmethod
    def inproc(cls, prefix: str = "autotune") -> Endpoints:
        """In-process endpoints: every component must share one ``zmq.Context``."""
        return cls(**{name: f"inproc://{prefix}-{name}" for name in _LINKS})


_LINKS = ("experience", "chunks", "trainers", "weights", "telemetry", "control")


def _free_port(host: str) -> int:
    with pysocket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def _socket(ctx: zmq.Context, kind: int, *, sndhwm: int = 1000, rcvhwm: int = 1000) -> zmq.Socket:
    sock = ctx.socket(kind)
    sock.setsockopt(zmq.SNDHWM, sndhwm)
    sock.setsockopt(zmq.RCVHWM, rcvhwm)
    sock.setsockopt(zmq.LINGER, LINGER_MS)
    return sock


# --- actors -------------------------------------------------------------------------------


def actor_experience_out(ctx: zmq.Context, ep: Endpoints) -> zmq.Socket:
    """The dispenser's PUSH to the compressor."""
    sock = _socket(ctx, zmq.PUSH, sndhwm=EXPERIENCE_HWM)
    sock.connect(ep.experience)
    return sock


def actor_weights_in(ctx: zmq.Context, ep: Endpoints) -> zmq.Socket:
    """An actor's SUB for versioned weights."""
    sock = _socket(ctx, zmq.SUB, rcvhwm=WEIGHTS_HWM)
    sock.setsockopt(zmq.SUBSCRIBE, b"")
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(ep.weights)
    return sock


# --- compressor -----------------------------------------------------------------------------


def compressor_sockets(
    ctx: zmq.Context, ep: Endpoints
) -> tuple[zmq.Socket, zmq.Socket, zmq.Socket]:
    """(experience PULL, chunks PUSH, control SUB) of the compressor."""
    pull = _socket(ctx, zmq.PULL, rcvhwm=EXPERIENCE_HWM)
    pull.bind(ep.experience)
    push = _socket(ctx, zmq.PUSH, sndhwm=CHUNK_HWM)
    push.connect(ep.chunks)
    return pull, push, _control_in(ctx, ep)


def _control_in(ctx: zmq.Context, ep: Endpoints) -> zmq.Socket:
    """A service's SUB for the runner's CONTROL commands (drain, exit)."""
    control = _socket(ctx, zmq.SUB)
    control.setsockopt(zmq.SUBSCRIBE, b"")
    control.connect(ep.control)
    return control


# --- migrator -------------------------------------------------------------------------------


def migrator_sockets(ctx: zmq.Context, ep: Endpoints) -> tuple[zmq.Socket, zmq.Socket, zmq.Socket]:
    """(chunks PULL, trainers ROUTER, control SUB) of the migrator."""
    pull = _socket(ctx, zmq.PULL, rcvhwm=CHUNK_HWM)
    pull.bind(ep.chunks)
    router = _socket(ctx, zmq.ROUTER, sndhwm=TRAINER_HWM, rcvhwm=TRAINER_HWM)
    router.setsockopt(zmq.ROUTER_MANDATORY, 1)
    router.bind(ep.trainers)
    return pull, router, _control_in(ctx, ep)


# --- trainers -------------------------------------------------------------------------------


def trainer_experience_in(ctx: zmq.Context, ep: Endpoints, rank: int) -> zmq.Socket:
    """A trainer's DEALER to the migrator; its identity is ``trainer-<rank>``."""
    sock = _socket(ctx, zmq.DEALER, sndhwm=TRAINER_HWM, rcvhwm=TRAINER_HWM)
    sock.setsockopt(zmq.IDENTITY, f"trainer-{rank}".encode())
    sock.connect(ep.trainers)
    return sock


def trainer_weights_out(ctx: zmq.Context, ep: Endpoints) -> zmq.Socket:
    """The lead trainer's PUB of versioned weights."""
    sock = _socket(ctx, zmq.PUB, sndhwm=WEIGHTS_HWM)
    sock.setsockopt(zmq.LINGER, 0)
    sock.bind(ep.weights)
    return sock


# --- telemetry and control ----------------------------------------------------------------


def telemetry_out(ctx: zmq.Context, ep: Endpoints) -> zmq.Socket:
    """Any process's PUSH of STATS messages to the runner."""
    sock = _socket(ctx, zmq.PUSH, sndhwm=TELEMETRY_HWM)
    sock.connect(ep.telemetry)
    return sock


def runner_sockets(ctx: zmq.Context, ep: Endpoints) -> tuple[zmq.Socket, zmq.Socket]:
    """(telemetry PULL, control PUB) of the runner."""
    pull = _socket(ctx, zmq.PULL, rcvhwm=TELEMETRY_HWM)
    pull.bind(ep.telemetry)
    pub = _socket(ctx, zmq.PUB)
    pub.bind(ep.control)
    return pull, pub
