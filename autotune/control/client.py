"""The client API for a training script run under ``autotune wrap``.

    from autotune import client

    knobs = client.knobs({"num_envs": 8, "batch_size": 256})   # defaults when not wrapped
    ...
    client.report(steps=global_step)                           # progress, now and then
    new = client.poll()                                        # live mode: new knobs or None

Outside ``autotune wrap`` every call is harmless: ``knobs`` returns the defaults, ``report``
and ``poll`` do nothing, so the script runs unchanged on its own.

Under ``autotune wrap`` the knobs come from ``AUTOTUNE_KNOBS`` (a JSON map; each knob is also
exported as ``AUTOTUNE_<NAME>`` for scripts that import nothing), and reports go to the wrapper
over the ipc socket in ``AUTOTUNE_WRAP``. Reporting is cheap (one small message, never blocks);
``steps`` is the script's running total of environment steps.
"""

from __future__ import annotations

import contextlib
import json
import os
from typing import Any

import zmq

from autotune.control import protocol
from autotune.control.protocol import MsgType

ENV_KNOBS = "AUTOTUNE_KNOBS"
ENV_ENDPOINT = "AUTOTUNE_WRAP"
ENV_TRIAL = "AUTOTUNE_TRIAL"
CONNECT_WAIT_MS = 2000

_link: Any = None
_current: dict[str, Any] | None = None
_defaults: dict[str, Any] = {}


def wrapped() -> bool:
    """Whether this process runs under ``autotune wrap``."""
    return bool(os.environ.get(ENV_ENDPOINT))


def knobs(defaults: dict[str, Any] | None = None) -> dict[str, Any]:
    """The knobs of this run: ``defaults`` overlaid with what the tuner chose. The defaults
    are remembered, so a later ``knobs()`` (after ``poll``) returns the whole set.

    Raises:
        ValueError: if ``AUTOTUNE_KNOBS`` is not a JSON object (a wrapper bug or a stray
            variable), naming the variable.
    """
    if defaults:
        _defaults.update(defaults)
    out = dict(_defaults)
    text = os.environ.get(ENV_KNOBS)
    if text:
        try:
            given = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{ENV_KNOBS} is not JSON ({exc}): {text[:80]!r}") from None
        if not isinstance(given, dict):
            raise ValueError(f"{ENV_KNOBS} must be a JSON object, got {text[:80]!r}")
        out.update(given)
    if _current is not None:
        out.update(_current)
    return out


class _Link:
    def __init__(self, endpoint: str) -> None:
        self.ctx = zmq.Context()
        self.sock = protocol.dealer(self.ctx, endpoint)
        self.trial = os.environ.get(ENV_TRIAL)
        self.seq = 0
        self.sock.poll(CONNECT_WAIT_MS, zmq.POLLOUT)  # so the first report is not dropped

    def send(self, kind: MsgType, **body: Any) -> None:
        msg = protocol.encode(kind, trial=self.trial, pid=os.getpid(), **body)
        # if the wrapper is gone or busy the message is dropped: progress is a running total
        with contextlib.suppress(zmq.Again):
            self.sock.send(msg, zmq.NOBLOCK)

    def take(self) -> dict[str, Any] | None:
        newest = None
        while self.sock.poll(0):
            try:
                msg = protocol.decode(self.sock.recv())
            except ValueError:
                continue
            if msg["type"] == MsgType.KNOBS and int(msg["seq"]) > self.seq:
                self.seq, newest = int(msg["seq"]), dict(msg["values"])
        return newest


def _get_link() -> _Link | None:
    global _link
    if _link is None and wrapped():
        _link = _Link(os.environ[ENV_ENDPOINT])
    return _link


def report(steps: int | None = None, **metrics: float) -> None:
    """Tells the wrapper the script's progress: ``steps`` is the running total of env steps
    (None if the script only signals that it is alive); ``metrics`` are extra numbers kept
    with the trial (for example ``episode_return``)."""
    link = _get_link()
    if link is not None:
        link.send(
            MsgType.PROGRESS,
            steps=None if steps is None else int(steps),
            metrics={k: float(v) for k, v in metrics.items()},
        )


def poll() -> dict[str, Any] | None:
    """Live mode: call at a safe point (between updates). Returns the new knobs once when the
    tuner changed them (apply them, then keep reporting), else None."""
    global _current
    link = _get_link()
    if link is None:
        return None
    new = link.take()
    link.send(MsgType.POLL, seq=link.seq)
    if new is not None:
        _current = new
    return new
