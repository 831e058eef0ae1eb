"""How an actor gets its actions: from its own CPU copy of the policy, or from an inference GMI.

Both kinds offer one interface to ``runtime.actor``:

* ``request(group, obs)`` hands over the observations of one group of environments;
* ``actions(group)`` returns that group's ``(actions, log-probs, policy version)``;
* ``value(obs)`` returns state values (to bootstrap truncated episodes);
* ``poll()`` takes newer weights if any, without blocking; ``version`` is the newest seen.

``LocalPolicy`` computes in ``actions`` on the actor's core and subscribes to the weights.
``RemotePolicy`` sends each request at once to the inference GMI (``runtime.inference``) and
waits for the answer in ``actions``, so an actor that splits its environments in two groups
steps one group while the other group's observations are being served (double buffering).
"""

from __future__ import annotations

import itertools
import time
from typing import Any

import numpy as np
import zmq

from runtime import wire

ANSWER_TIMEOUT_S = 60.0
"""How long an actor waits for the inference GMI before it gives up (and exits with an error;
the runner has noticed a dead inference GMI long before)."""


class WeightsReceiver:
    """Applies the newest genuine WEIGHTS message waiting on a SUB socket to ``model``, never
    blocking. Every message must carry the run's signature (``wire.check_weights``) and a
    version above the one held; a forged, malformed or older one is dropped and counted."""

    def __init__(self, sock: zmq.Socket, model: Any, name: str, key: bytes) -> None:
        self.sock = sock
        self.model = model
        self.key = key
        self.version = 0
        self.malformed = wire.MalformedCounter(f"{name}-weights")

    def poll(self, timeout_ms: int = 0) -> None:
        if not self.sock.poll(timeout_ms):
            return
        waiting = [
            m
            for m in wire.recv_waiting(self.sock, self.malformed)
            if m.type is wire.MsgType.WEIGHTS
        ]
        for msg in reversed(waiting):  # the newest genuine one wins; older ones go unchecked
            try:
                version, names = wire.check_weights(self.key, msg)
            except wire.ProtocolError as exc:
                self.malformed.drop(exc)
                continue
            if version <= self.version or not msg.arrays:
                continue
            try:
                self.model.load_state_arrays(names, msg.arrays)
                self.version = version
                return
            except (wire.ProtocolError, KeyError, RuntimeError, TypeError, ValueError) as exc:
                self.malformed.drop(exc)


class LocalPolicy:
    """The policy on the actor's own core (``inference='actor'``)."""

    def __init__(self, weights: WeightsReceiver) -> None:
        self.weights = weights
        self.model = weights.model
        self._obs: dict[int, np.ndarray] = {}

    @property
    def version(self) -> int:
        return self.weights.version

    def poll(self, timeout_ms: int = 0) -> None:
        self.weights.poll(timeout_ms)

    def request(self, group: int, obs: np.ndarray) -> None:
        self._obs[group] = obs

    def actions(self, group: int) -> tuple[np.ndarray, np.ndarray, int]:
        self.weights.poll()
        act, logp = self.model.act(self._obs.pop(group))
        return act, logp, self.weights.version

    def value(self, obs: np.ndarray) -> np.ndarray:
        return self.model.value(obs)


class RemotePolicy:
    """The policy served by the inference GMI (``inference='gmi'``) over a DEALER socket."""

    def __init__(self, sock: zmq.Socket) -> None:
        self.sock = sock
        self.version = 0
        self.waited_s = 0.0
        """Time spent waiting for answers (the actor's idle time)."""
        self.malformed = wire.MalformedCounter("actor-inference")
        self._tags = itertools.count()
        self._pending: dict[int, int] = {}  # group -> tag of its outstanding request
        self._answers: dict[int, wire.Message] = {}

    def poll(self, timeout_ms: int = 0) -> None:
        """Nothing to take: the version arrives with every answer."""

    def _send(self, kind: str, obs: np.ndarray) -> int:
        tag = next(self._tags)
        # a copy: the actor overwrites its observation buffer while this may still be queued
        wire.send_msg(
            self.sock,
            wire.MsgType.INFER,
            {"tag": tag, "kind": kind},
            [np.array(obs, np.float32, copy=True)],
        )
        return tag

    def request(self, group: int, obs: np.ndarray) -> None:
        self._pending[group] = self._send("act", obs)

    def actions(self, group: int) -> tuple[np.ndarray, np.ndarray, int]:
        msg = self._await(self._pending.pop(group))
        if len(msg.arrays) != 2:
            raise wire.ProtocolError(f"actions answer with {len(msg.arrays)} arrays, expected 2")
        version = wire.meta_int(msg.meta, "version")
        self.version = max(self.version, version)
        return msg.arrays[0], msg.arrays[1], version

    def value(self, obs: np.ndarray) -> np.ndarray:
        msg = self._await(self._send("value", obs))
        if len(msg.arrays) != 1:
            raise wire.ProtocolError(f"values answer with {len(msg.arrays)} arrays, expected 1")
        return msg.arrays[0]

    def _await(self, tag: int) -> wire.Message:
        started = time.monotonic()
        while tag not in self._answers:
            if not self.sock.poll(1000):
                if time.monotonic() - started > ANSWER_TIMEOUT_S:
                    raise TimeoutError(f"the inference GMI did not answer in {ANSWER_TIMEOUT_S} s")
                continue
            for msg in wire.recv_waiting(self.sock, self.malformed):
                try:
                    if msg.type is not wire.MsgType.ACTIONS:
                        raise wire.ProtocolError(f"expected actions, got {msg.type.value}")
                    self._answers[wire.meta_int(msg.meta, "tag")] = msg
                except wire.ProtocolError as exc:
                    self.malformed.drop(exc)
        self.waited_s += time.monotonic() - started
        return self._answers.pop(tag)
